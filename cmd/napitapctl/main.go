// napitapctl fetches a tap's NAPI queue fds from napitapd and runs a VMM
// with them, runs a runtime whose by-name tap opens napitapd turns into
// NAPI queues, or lists what napitapd holds.
//
//	napitapctl exec --container ID --ifname net1 -- qemu-system-x86_64 ... -netdev tap,id=n0,fds={fds},vhost=off
//	napitapctl launch -- qemu-system-x86_64 ... -netdev tap,id=n0,ifname=tap1,queues=4
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/napitap/napitap/pkg/buildinfo"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/seccompagent"
)

// usage prints the usage to stderr and exits 2: a command line napitapctl
// cannot run.
func usage() {
	printUsage()
	os.Exit(2)
}

// printUsage is what --help and help print: every verb's usage.
func printUsage() {
	fmt.Fprint(os.Stderr, "usage:\n")
	for _, v := range verbs {
		fmt.Fprint(os.Stderr, v.usage)
	}
	fmt.Fprint(os.Stderr, "  napitapctl help [VERB]\n      This, or one verb's usage (as VERB --help). --socket goes before or after the verb.\n")
}

// printVerbUsage is VERB --help's and help VERB's: that verb's usage alone.
func printVerbUsage(name string) bool {
	for _, v := range verbs {
		if v.name == name {
			fmt.Fprint(os.Stderr, "usage:\n"+v.usage)
			return true
		}
	}
	return false
}

// verbs is the usage of each verb, in the order --help lists them.
var verbs = []struct{ name, usage string }{
	{"exec", `  napitapctl [--socket PATH] exec [--container ID --ifname IF] -- CMD [ARGS...]
      Fetch the attachment's queue fds (without --container: the one in this
      process's netns) and run CMD with them as fds 3, 4, ...; in ARGS,
      "{fds}" becomes "3:4:...", "{fds,}" "3,4,...", "{queues}" the queue
      count and "{mac}" the MAC the guest must use. Signals are passed on;
      napitapctl exits with CMD's status.
`},
	{"launch", `  napitapctl launch [--seccomp-socket PATH] -- CMD [ARGS...]
      Exec CMD under a seccomp filter whose TUNSETIFF calls napitapd serves:
      opening a napitap tap by name gives NAPI queues. CMD and everything
      it starts stay under the filter; without napitapd their TUNSETIFF
      fails with ENOSYS.
`},
	{"list", `  napitapctl [--socket PATH] list
      What napitapd holds: MODE is intercept (the VMM opens the tap by name)
      or fds (napitapd holds the queues), MAC is the guest's, HELD the queue
      fds napitapd holds now (0 after a fetch, until the next fetch reopens
      them).
`},
	{"queues", `  napitapctl queues --netns PATH --tap NAME [-o table|json]
  napitapctl [--socket PATH] queues --container ID --ifname IF [-o table|json]
      Every open queue of the tap on the node, read from the kernel: the
      process holding it (pid, command), its fd, and TUNGETIFF's flags on
      it, NAPI among them. The kernel keeps one set of flags per tap, those
      of the attach that took it from no queue to one (docs/DESIGN.md fact
      2): they are the queues' when all were opened alike, as a VMM opens
      them. Detached queues are not listed. Needs root with CAP_SYS_PTRACE
      (napitapd's container has it).
`},
	{"ready", `  napitapctl [--socket PATH] ready
      Exit 0 only if the napitapd answering on the socket runs in this
      process's container (the same mount namespace): the DaemonSet's
      readiness probe, which a pod whose napitapd has not taken over from
      the old pod's must fail, however well the old one answers.
`},
	{"probe", `  napitapctl probe [FDS]
      Diagnostic, run by exec: napitapctl exec -- napitapctl probe {fds}.
      Write 16 in-order TCP segments into the first queue fd of FDS
      (default 3) and tell whether GRO in the tap's netns merged them,
      which only a NAPI queue does, given the tap's gro_flush_timeout;
      exits 1 if it did not.
`},
	{"seccomp-profile", `  napitapctl seccomp-profile [--listener PATH] vmm|virt-launcher
  napitapctl seccomp-profile [--listener PATH] --install DIR
      Print a Localhost seccomp profile that sends the VMM's TUNSETIFF to
      napitapd's seccomp agent, or install every kind into DIR (a kubelet
      seccomp dir, e.g. /var/lib/kubelet/seccomp/napitap).
`},
	{"install-plugin", `  napitapctl install-plugin [--from PATH] --dir DIR [--name NAME]
      Install the plugin binary (default /opt/napitap/bin/napitap) into the
      CNI bin dir DIR under its own name (or NAME), atomically: a temporary file in
      DIR, synced, then renamed over the old one, so that a runtime exec'ing
      the plugin meanwhile runs the old or the new one. A symlink there is
      refused. Says what it replaced.
`},
	{"version", `  napitapctl [--socket PATH] version
      Print napitapctl's version, then that of the napitapd on the socket
      (--version: napitapctl's alone, connecting to nothing).
`},
	{"wait", `  napitapctl wait
      Do nothing until SIGTERM or SIGINT, then exit 0: the container of a
      pod that keeps its network while a VMM is started in it by hand
      (kubectl exec POD -- napitapctl exec -- qemu-system-x86_64 ...).
`},
}

// usageError reports a command line napitapctl cannot run, as usage does,
// but says what is wrong with it.
func usageError(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "napitapctl: "+format+" (napitapctl --help shows the usage)\n", a...)
	os.Exit(2)
}

// subFlags is a subcommand's flag set: --help prints its usage and exits 0,
// before anything connects; a bad flag exits 2.
func subFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	fs.Usage = func() { printVerbUsage(name) }
	return fs
}

// clientFlags is subFlags for a verb that talks to napitapd: --socket, the
// global flag, may come after the verb too, as kubectl's do.
func clientFlags(name string, client *handoff.Client) *flag.FlagSet {
	fs := subFlags(name)
	fs.StringVar(&client.Socket, "socket", client.Socket, "napitapd socket")
	return fs
}

func main() {
	socket := flag.String("socket", handoff.DefaultSocket, "napitapd socket")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Usage = printUsage
	flag.Parse()
	client := &handoff.Client{Socket: *socket}
	if *showVersion {
		fmt.Println(buildinfo.String("napitapctl"))
		return
	}
	if flag.NArg() == 0 {
		usage()
	}
	switch flag.Arg(0) {
	case "install-plugin", "seccomp-profile":
		// They write into host dirs (the CNI bin dir, the kubelet's
		// seccomp dir): a uid-0 process without CAP_SYS_PTRACE must not
		// reach them through /proc/PID/root (docs/threat-model.md).
		notDumpable()
	}
	var err error
	switch flag.Arg(0) {
	case "help":
		switch args := flag.Args()[1:]; {
		case len(args) == 0:
			printUsage()
		case len(args) > 1 || !printVerbUsage(args[0]):
			usageError("help: no verb %q", strings.Join(args, " "))
		}
	case "exec":
		err = execCmd(client, flag.Args()[1:])
	case "launch":
		err = launch(flag.Args()[1:])
	case "list":
		err = list(client, flag.Args()[1:])
	case "queues":
		err = queues(client, flag.Args()[1:])
	case "probe":
		err = probe(flag.Args()[1:])
	case "ready":
		err = ready(client, flag.Args()[1:])
	case "seccomp-profile":
		err = seccompProfile(flag.Args()[1:])
	case "install-plugin":
		err = installPlugin(flag.Args()[1:])
	case "wait":
		err = wait(flag.Args()[1:])
	case "version":
		err = versions(client, flag.Args()[1:])
	default:
		usageError("unknown command %q", flag.Arg(0))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "napitapctl:", explain(err, client.Socket))
		os.Exit(1)
	}
}

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

func launch(args []string) error {
	fs := subFlags("launch")
	socket := fs.String("seccomp-socket", seccompagent.DefaultSocket, "napitapd's seccomp socket")
	fs.Parse(args)
	if fs.NArg() == 0 {
		usage()
	}
	return seccompagent.Launch(*socket, fs.Args(), os.Environ())
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

func list(client *handoff.Client, args []string) error {
	fs := clientFlags("list", client)
	fs.Parse(args)
	if fs.NArg() != 0 {
		usageError("list takes no arguments, got %q", fs.Args())
	}
	atts, err := client.List()
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONTAINER\tIFNAME\tTAP\tMODE\tQUEUES\tHELD\tNAPI\tMAC\tNETNS")
	for _, a := range atts {
		// intercept: the VMM opens the tap by name and the agent adds NAPI;
		// fds: napitapd holds the queues until a fetch.
		mode := "fds"
		if a.Intercept {
			mode = "intercept"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%v\t%s\t%s\n", a.ContainerID, a.IfName, a.TapName, mode, a.Queues, a.Held, a.NAPI, a.MAC, a.Netns)
	}
	return w.Flush()
}

// versions prints napitapctl's version, then that of the napitapd that
// answers on the socket: which one a node runs.
func versions(client *handoff.Client, args []string) error {
	fs := clientFlags("version", client)
	fs.Parse(args)
	if fs.NArg() != 0 {
		usageError("version takes no arguments, got %q", fs.Args())
	}
	fmt.Println(buildinfo.String("napitapctl"))
	st, err := client.Status()
	if err != nil {
		return err
	}
	v := st.Version
	if v == "" {
		v = "older than versions" // before pkg/buildinfo
	}
	fmt.Printf("napitapd %s (pid %d, at %s)\n", v, st.Pid, client.Socket)
	return nil
}

// ready: the napitapd that answers is this container's own.
func ready(client *handoff.Client, args []string) error {
	fs := clientFlags("ready", client)
	fs.Parse(args)
	if fs.NArg() != 0 {
		usageError("ready takes no arguments, got %q", fs.Args())
	}
	theirs, err := client.Status()
	if err != nil {
		return err
	}
	ours, err := handoff.OwnStatus()
	if err != nil {
		return err
	}
	if theirs.MountNS != ours.MountNS {
		return fmt.Errorf("not ready: %s is served by napitapd pid %d of another container (mount namespace %d, this one's is %d): this container's napitapd has not taken over", client.Socket, theirs.Pid, theirs.MountNS, ours.MountNS)
	}
	fmt.Printf("ready: napitapd pid %d, of this container, serves %s\n", theirs.Pid, client.Socket)
	return nil
}

// probe runs napiprobe on the first of fds ("3:4:..." or "3,4,...", as
// exec's {fds} and {fds,} expand), a queue fd this process inherited.
func probe(args []string) error {
	fs := subFlags("probe")
	fs.Parse(args)
	args = fs.Args()
	if len(args) > 1 {
		usage()
	}
	fds := "3"
	if len(args) == 1 {
		fds = args[0]
	}
	first, _, _ := strings.Cut(strings.ReplaceAll(fds, ",", ":"), ":")
	fd, err := strconv.Atoi(first)
	if err != nil || fd < 3 {
		return fmt.Errorf("probe: %q is no queue fd (3 or more)", first)
	}
	res, err := napiprobe.RunQueue(os.NewFile(uintptr(fd), "fd "+first), 16, 1000)
	if err != nil {
		return err
	}
	fmt.Printf("queue fd %d: %s\n", fd, res)
	if !res.Merged() {
		return fmt.Errorf("probe: no merged skb on fd %d (%v)", fd, res.SKBLens)
	}
	return nil
}

// wait blocks until the container runtime stops the container. napitap's
// image has no shell and no sleep (FROM scratch).
func wait(args []string) error {
	fs := subFlags("wait")
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		usageError("wait takes no arguments, got %q", fs.Args())
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}
