package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/napitap/napitap/pkg/handoff"
)

// execUsage is what --help and help exec print (main.go's verbs).
const execUsage = `  napitapctl [--socket PATH] exec [--container ID --ifname IF] -- CMD [ARGS...]
      Fetch the attachment's queue fds (without --container: the one in this
      process's netns) and run CMD with them as fds 3, 4, ...; in ARGS,
      "{fds}" becomes "3:4:...", "{fds,}" "3,4,...", "{queues}" the queue
      count and "{mac}" the MAC the guest must use. Signals are passed on;
      napitapctl exits with CMD's status.
`

func execCmd(client *handoff.Client, args []string) error {
	fs := clientFlags("exec", client)
	container := fs.String("container", "", "container ID of the attachment")
	ifName := fs.String("ifname", "", "CNI_IFNAME of the attachment")
	fs.Parse(args)
	argv := fs.Args()
	if (*container == "") != (*ifName == "") {
		usageError("exec: --container and --ifname name an attachment together: give both, or neither for the one attachment in this network namespace")
	}
	if len(argv) == 0 {
		usageError("exec: no command to run: give it after --")
	}
	var key *handoff.Key
	if *container != "" {
		key = &handoff.Key{ContainerID: *container, IfName: *ifName}
	}
	att, files, err := client.Fetch(key)
	if err != nil {
		return err
	}
	if argv, err = expandArgs(att, len(files), argv); err != nil {
		closeAll(files)
		return err
	}
	// A child, not an exec of this process: os/exec places the fds after
	// fork, where no Go runtime fd can be in the way.
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = files
	// Catch signals before the VMM exists: one arriving in between must not
	// kill napitapctl and orphan a VMM that holds the queues.
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := cmd.Start(); err != nil {
		closeAll(files)
		return err
	}
	// Only the VMM may hold the queues (DESIGN.md fact 7).
	closeAll(files)
	go func() {
		for sig := range signals {
			_ = cmd.Process.Signal(sig)
		}
	}()
	err = cmd.Wait()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		os.Exit(exitErr.ExitCode())
	}
	return err
}

// expandArgs replaces the placeholders in argv for att, whose n queues
// become fds 3, 4, ... (ExtraFiles[i] is fd 3+i).
func expandArgs(att *handoff.Attachment, n int, argv []string) ([]string, error) {
	nums := make([]string, n)
	for i := range nums {
		nums[i] = strconv.Itoa(3 + i)
	}
	// An empty MAC would reach the VMM as "mac=", which QEMU refuses with
	// a message that names neither napitap nor the attachment.
	if att.MAC == "" && slices.ContainsFunc(argv, func(a string) bool { return strings.Contains(a, "{mac}") }) {
		return nil, fmt.Errorf("{mac}: napitapd has no guest MAC for attachment %s (tap %q), which an older napitap recorded: write the guest's MAC in place of {mac}", att.Key, att.TapName)
	}
	expand := strings.NewReplacer(
		"{fds}", strings.Join(nums, ":"), // QEMU: fds=3:4
		"{fds,}", strings.Join(nums, ","), // Cloud Hypervisor: fd=[3,4]
		"{queues}", strconv.Itoa(att.Queues),
		"{mac}", att.MAC,
	)
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = expand.Replace(a)
	}
	return out, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
