package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Guest is what the guest's init configures and runs.
type Guest struct {
	IP      string // CIDR, e.g. "10.199.0.2/24"; empty: no address
	Gateway string // optional default route
	MAC     string // the NIC's MAC (virtio-net-pci mac=); empty: QEMU's default
	// Script is a /bin/sh (busybox) script run in /tmp after eth0 is up;
	// its stdout/stderr go to the serial console and its exit status is
	// reported as "NAPITAP-GUEST-DONE rc=<n>". It travels through fw_cfg,
	// so its size is not limited by the kernel command line.
	Script string
}

// QEMUArgs is the qemu-system-x86_64 argv (argv[0] included) for a TCG
// guest with one virtio-net NIC on netdev, e.g.
// "tap,id=n0,fds=3:4,vhost=off" or
// "tap,id=n0,ifname=tap0,script=no,downscript=no,vhost=off,queues=2".
// The netdev's id must be n0. With queues > 1 the NIC is multiqueue
// (mq=on, vectors=2*queues+2) and the guest gets queues vCPUs, so that its
// virtio_net driver enables every queue pair. The console (ttyS0) is
// written to serialPath, which must not contain a comma.
//
// noGuestTSO turns off the device's TSO/UFO/ECN offloads for guest
// transmit (host_tso4/host_tso6/host_ecn/host_ufo=off), so the guest
// segments TCP itself and the tap receives MTU-sized segments instead of
// 64 KB GSO frames: what GRO on a NAPI queue can merge.
func QEMUArgs(kernel, initrd, netdev string, queues int, g Guest, serialPath string, noGuestTSO bool) []string {
	if queues < 1 {
		queues = 1
	}
	dev := "virtio-net-pci,netdev=n0,romfile="
	if g.MAC != "" {
		dev += ",mac=" + strings.ToLower(g.MAC)
	}
	if queues > 1 {
		dev += ",mq=on,vectors=" + strconv.Itoa(2*queues+2)
	}
	if noGuestTSO {
		dev += ",host_tso4=off,host_tso6=off,host_ecn=off,host_ufo=off"
	}
	args := []string{
		"qemu-system-x86_64",
		"-machine", "q35,accel=tcg",
		"-smp", strconv.Itoa(queues),
		"-m", "256",
		"-nodefaults", "-no-user-config",
		"-display", "none",
		"-no-reboot",
		"-serial", "file:" + serialPath,
		"-kernel", kernel,
		"-initrd", initrd,
		"-append", KernelCmdline(g),
		"-netdev", netdev,
		"-device", dev,
	}
	if g.Script != "" {
		// QEMU's option syntax: a literal comma is written ",,".
		args = append(args, "-fw_cfg", "name="+fwCfgScript+",string="+strings.ReplaceAll(g.Script, ",", ",,"))
	}
	return args
}

// KernelCmdline is the guest kernel's command line: the console on ttyS0
// and what /init reads to configure the NIC. no_timer_check: under TCG on
// a busy host the kernel's check that the IO-APIC delivers the timer can
// run out of time, and it panics ("IO-APIC + timer doesn't work!", seen in
// the kind suite's CI run of 2026-12-06).
func KernelCmdline(g Guest) string {
	cmdline := []string{"console=ttyS0", "quiet", "loglevel=4", "panic=-1", "rdinit=/init", "no_timer_check"}
	if g.IP != "" {
		cmdline = append(cmdline, "napitap.ip="+g.IP)
	}
	if g.Gateway != "" {
		cmdline = append(cmdline, "napitap.gw="+g.Gateway)
	}
	if g.MAC != "" {
		cmdline = append(cmdline, "napitap.mac="+strings.ToLower(g.MAC))
	}
	return strings.Join(cmdline, " ")
}

// VM is a started QEMU (or a launcher that execs it).
type VM struct {
	Cmd        *exec.Cmd
	SerialPath string // the guest console
	LogPath    string // the process's stdout and stderr

	done    chan struct{} // closed once Cmd.Wait returned
	waitErr error
	stop    sync.Mutex
}

// Start runs argv (which may be prefixed by a launcher such as
// `napitapctl exec ... --`) with extraFiles inherited as fds 3, 4, ... and
// returns once the process started. Its stdout and stderr go to LogPath,
// next to serialPath (<serialPath without extension>.qemu.log); a stale
// serialPath is removed first. The process gets SIGKILL if the calling
// process dies. The caller may close its copies of extraFiles afterwards.
func Start(argv []string, extraFiles []*os.File, serialPath string) (*VM, error) {
	if len(argv) == 0 {
		return nil, errors.New("vm: start: empty argv")
	}
	logPath := strings.TrimSuffix(serialPath, filepath.Ext(serialPath)) + ".qemu.log"
	if err := os.Remove(serialPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("vm: remove stale serial log %s: %w", serialPath, err)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("vm: create %s log %s: %w", argv[0], logPath, err)
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.ExtraFiles = extraFiles
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("vm: start %s: %w", argv[0], err)
	}
	vm := &VM{Cmd: cmd, SerialPath: serialPath, LogPath: logPath, done: make(chan struct{})}
	go func() {
		vm.waitErr = cmd.Wait()
		close(vm.done)
	}()
	return vm, nil
}

// Serial returns the serial output so far.
func (vm *VM) Serial() string {
	b, _ := os.ReadFile(vm.SerialPath)
	return string(b)
}

// WaitFor polls the serial output until it contains marker, the process
// exits, or ctx ends; on failure the error includes the tail of the serial
// log and of the process's log.
func (vm *VM) WaitFor(ctx context.Context, marker string) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if strings.Contains(vm.Serial(), marker) {
			return nil
		}
		select {
		case <-vm.done:
			if strings.Contains(vm.Serial(), marker) {
				return nil
			}
			return vm.errorf("%s (pid %d) exited (%v) before the serial console showed %q",
				vm.name(), vm.Cmd.Process.Pid, exitStatus(vm.waitErr), marker)
		case <-ctx.Done():
			return vm.errorf("waiting for %q on the serial console of %s (pid %d): %w",
				marker, vm.name(), vm.Cmd.Process.Pid, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// Wait waits until the process exits (e.g. after the guest powered off) or
// ctx ends, and returns how it exited.
func (vm *VM) Wait(ctx context.Context) error {
	select {
	case <-vm.done:
		if vm.waitErr != nil {
			return vm.errorf("%s (pid %d): %v", vm.name(), vm.Cmd.Process.Pid, vm.waitErr)
		}
		return nil
	case <-ctx.Done():
		return vm.errorf("waiting for %s (pid %d) to exit: %w", vm.name(), vm.Cmd.Process.Pid, context.Cause(ctx))
	}
}

// Stop kills the process by its PID (SIGTERM, then SIGKILL after 3 s) and
// waits for it; idempotent, and a no-op once the process has exited.
func (vm *VM) Stop() error {
	if vm == nil || vm.Cmd == nil || vm.Cmd.Process == nil {
		return nil
	}
	vm.stop.Lock()
	defer vm.stop.Unlock()
	select {
	case <-vm.done:
		return nil
	default:
	}
	pid := vm.Cmd.Process.Pid
	if err := vm.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("vm: SIGTERM %s (pid %d): %w", vm.name(), pid, err)
	}
	select {
	case <-vm.done:
		return nil
	case <-time.After(3 * time.Second):
	}
	if err := vm.Cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("vm: SIGKILL %s (pid %d): %w", vm.name(), pid, err)
	}
	select {
	case <-vm.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("vm: %s (pid %d) still running 10 s after SIGKILL", vm.name(), pid)
	}
}

func (vm *VM) name() string { return filepath.Base(vm.Cmd.Path) }

func (vm *VM) errorf(format string, args ...any) error {
	err := fmt.Errorf("vm: "+format, args...)
	return fmt.Errorf("%w\n--- serial %s (tail) ---\n%s\n--- %s log %s (tail) ---\n%s",
		err, vm.SerialPath, tail(vm.Serial(), 40), vm.name(), vm.LogPath, tail(readString(vm.LogPath), 20))
}

func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func readString(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return string(b)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
