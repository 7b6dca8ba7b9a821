package main

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"github.com/napitap/napitap/pkg/handoff"
	"golang.org/x/sys/unix"
)

// notDumpable makes this process's /proc entries (fd, root, mem) closed
// to any process without CAP_SYS_PTRACE, root or not.
func notDumpable() {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "napitapctl: prctl(PR_SET_DUMPABLE, 0):", err)
		os.Exit(1)
	}
}

// explain adds to err what an operator needs to act on it.
func explain(err error, socket string) string {
	msg := err.Error()
	var notFound *handoff.Error
	switch {
	case errors.Is(err, handoff.ErrUnreachable) && errors.Is(err, syscall.EACCES):
		if gid, group := socketGroup(socket); gid == 0 {
			msg += fmt.Sprintf("\nnapitapctl: only root may connect to %s: run napitapctl as root, or have napitapd's --socket-group name a group for the runtimes", socket)
		} else {
			msg += fmt.Sprintf("\nnapitapctl: only root and the socket's group may connect to %s: add this user to %s (id shows its groups; napitapd --socket-group chooses the group)", socket, group)
		}
	case errors.Is(err, handoff.ErrUnreachable) && (errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)):
		msg += fmt.Sprintf("\nnapitapctl: no napitapd listens at %s: is the napitap DaemonSet running on this node? (kubectl -n napitap-system get pods -o wide)", socket)
	case errors.As(err, &notFound) && notFound.Code == handoff.CodeNotFound && strings.Contains(notFound.Message, "caller's netns"):
		msg += "\nnapitapctl: run it in the pod's network namespace (kubectl exec into the pod), or name the attachment with --container ID --ifname IF"
	}
	return msg
}

// socketGroup is the gid that owns socket (-1 if unknown), and its name
// as ls -l would give it.
func socketGroup(socket string) (int, string) {
	var st syscall.Stat_t
	if err := syscall.Stat(socket, &st); err != nil {
		return -1, "the socket's group (ls -l shows it)"
	}
	gid := strconv.FormatUint(uint64(st.Gid), 10)
	if g, err := user.LookupGroupId(gid); err == nil {
		return int(st.Gid), fmt.Sprintf("group %q (gid %s)", g.Name, gid)
	}
	return int(st.Gid), "gid " + gid
}
