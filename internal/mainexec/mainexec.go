// Package mainexec runs a command's main from its own test binary, so that
// a test starts the very program it tests as a process of its own (its
// exit, its signals, its /proc entries), without building it first.
package mainexec

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"testing"
)

// env names the main a re-executed test binary runs.
const env = "NAPITAP_TEST_MAIN"

// Run is a TestMain: in a process Command started, it runs main with
// Command's arguments, as the program name; otherwise the tests.
func Run(m *testing.M, name string, main func()) {
	if os.Getenv(env) == name {
		args := os.Args[1:]
		if i := slices.Index(args, "--"); i >= 0 {
			args = args[i+1:]
		}
		os.Args = append([]string{name}, args...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Command is the test binary running name's main (Run) with args.
func Command(name string, args ...string) *exec.Cmd {
	return CommandContext(context.Background(), name, args...)
}

// CommandContext is Command, killed when ctx is done.
func CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), env+"="+name)
	return cmd
}
