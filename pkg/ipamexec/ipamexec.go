// Package ipamexec runs the IPAM plugin a network config names, the way the
// CNI spec has a plugin delegate: the plugin's binary found on CNI_PATH, the
// caller's own environment with CNI_COMMAND set, the same config on stdin.
//
// libcni's invoke package does the same, but brings OpenTelemetry and
// net/http with it, and plugins' pkg/ipam brings nftables and iptables: their
// package init cost every napitap exec milliseconds it never used (issue 13).
//
// Whoever writes the network config picks the plugin, so each exec is
// bounded: it never leads back to napitap, it is killed with its children
// after Timeout, and no more than MaxOutput of its stdout is read.
package ipamexec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"
)

const (
	// Timeout bounds each exec. IPAM answers in milliseconds, or seconds
	// when it asks a DHCP or API server; kubelet gives the whole sandbox
	// set-up 2 minutes (--runtime-request-timeout), and a failed ADD may
	// still need an IPAM DEL within them.
	Timeout = 30 * time.Second
	// MaxOutput bounds the stdout read: a result is a few hundred bytes.
	MaxOutput = 1 << 20
	// maxDetail bounds the stderr (or stdout) quoted in an error.
	maxDetail = 4 << 10
	// envUnder, set to the plugin's name in its environment, tells a
	// napitap started beneath an IPAM plugin that it is there.
	envUnder = "NAPITAP_UNDER_IPAM"
)

// ErrNotFound: no executable of the plugin's name is on CNI_PATH.
var ErrNotFound = errors.New("not found in CNI_PATH")

var errOutputTooLarge = errors.New("more than 1 MiB on stdout")

// Add runs ADD and converts the plugin's result to the current version.
func Add(ctx context.Context, plugin string, netconf []byte) (*current.Result, error) {
	out, err := run(ctx, plugin, "ADD", netconf)
	if err != nil {
		return nil, err
	}
	result, err := parseResult(netconf, out)
	if err != nil {
		return nil, fmt.Errorf("ipam %q: result: %w", plugin, err)
	}
	return result, nil
}

// Del runs DEL.
func Del(ctx context.Context, plugin string, netconf []byte) error {
	_, err := run(ctx, plugin, "DEL", netconf)
	return err
}

// Check runs CHECK.
func Check(ctx context.Context, plugin string, netconf []byte) error {
	_, err := run(ctx, plugin, "CHECK", netconf)
	return err
}

// Status runs STATUS.
func Status(ctx context.Context, plugin string, netconf []byte) error {
	_, err := run(ctx, plugin, "STATUS", netconf)
	return err
}

// GC runs GC; netconf carries cni.dev/valid-attachments already.
func GC(ctx context.Context, plugin string, netconf []byte) error {
	_, err := run(ctx, plugin, "GC", netconf)
	return err
}

// run execs plugin for command and returns its stdout. A plugin that fails
// with a CNI error keeps its code, so that the runtime sees the IPAM's
// reason (a full pool, say) and not an internal error of napitap's.
func run(ctx context.Context, plugin, command string, netconf []byte) ([]byte, error) {
	// A plugin that leads back to napitap makes each napitap exec one more,
	// without end, until the node runs out of pids (issue 19). napitap
	// itself is caught before the exec; anything else that runs napitap
	// again, by the napitap beneath it.
	if under, ok := os.LookupEnv(envUnder); ok {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.type: napitap runs beneath the IPAM plugin %q of another napitap; an IPAM plugin that leads back to napitap would exec without end", under), "")
	}
	path, err := find(plugin)
	if err != nil {
		return nil, fmt.Errorf("ipam %q: %w", plugin, err)
	}
	if isSelf(path) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.type: %q (%s) is napitap itself, not an IPAM plugin", plugin, path), "")
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	limit := time.Until(deadline).Round(time.Millisecond)
	env := append(withoutCommand(os.Environ()), "CNI_COMMAND="+command, envUnder+"="+plugin)
	var stdout, stderr []byte
	for attempt := 0; ; attempt++ {
		stdout, stderr, err = execOnce(ctx, path, env, netconf)
		// A binary being replaced on the node is briefly busy.
		if !errors.Is(err, syscall.ETXTBSY) || attempt == 4 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	switch {
	case err == nil:
		return stdout, nil
	case errors.Is(err, context.DeadlineExceeded):
		// 11, try again later: a plugin waiting on a DHCP or API server may
		// well answer when the runtime retries the sandbox.
		return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("ipam %q: %s: no answer within %v; killed its process group", plugin, command, limit), "")
	case errors.Is(err, errOutputTooLarge), errors.Is(err, context.Canceled):
		return nil, fmt.Errorf("ipam %q: %s: %w; killed its process group", plugin, command, err)
	}
	var cniErr types.Error
	if json.Unmarshal(stdout, &cniErr) == nil && cniErr.Code != 0 {
		cniErr.Msg = fmt.Sprintf("ipam %q: %s: %s", plugin, command, cniErr.Msg)
		return nil, &cniErr
	}
	detail := strings.TrimSpace(string(stderr))
	if detail == "" {
		detail = strings.TrimSpace(string(stdout[:min(len(stdout), maxDetail)]))
	}
	return nil, fmt.Errorf("ipam %q: %s: %w: %s", plugin, command, err, detail)
}

// execOnce runs path in a process group of its own (napitap's is the
// runtime's), so that on timeout, or past MaxOutput, one SIGKILL takes its
// children too: they would otherwise outlive napitap.
func execOnce(ctx context.Context, path string, env []string, netconf []byte) (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	out := &capped{max: MaxOutput, full: func() { cancel(errOutputTooLarge) }}
	errOut := &capped{max: maxDetail}
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = env
	cmd.Stdin = bytes.NewReader(netconf)
	cmd.Stdout, cmd.Stderr = out, errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A child that left the group may hold the pipes open: Wait gives up on them then.
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	if cause := context.Cause(ctx); err != nil && cause != nil {
		err = cause
	}
	return out.buf.Bytes(), errOut.buf.Bytes(), err
}

// capped keeps the first max bytes written to it. Past them it calls full
// and fails, or, with no full, drops the rest.
type capped struct {
	buf  bytes.Buffer
	max  int
	full func()
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.max - c.buf.Len()
	if len(p) <= room {
		return c.buf.Write(p)
	}
	if c.full != nil {
		c.full()
		return 0, errOutputTooLarge
	}
	c.buf.Write(p[:room])
	return len(p), nil
}

// isSelf: path is the running binary, whatever its name on CNI_PATH.
func isSelf(path string) bool {
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && os.SameFile(self, fi)
}

// find looks for plugin on CNI_PATH, as the runtime found napitap.
func find(plugin string) (string, error) {
	if plugin == "" || strings.ContainsRune(plugin, '/') {
		return "", fmt.Errorf("%q is not a plugin name", plugin)
	}
	dirs := filepath.SplitList(os.Getenv("CNI_PATH"))
	for _, dir := range dirs {
		path := filepath.Join(dir, plugin)
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return path, nil
		}
	}
	return "", fmt.Errorf("%w %q", ErrNotFound, strings.Join(dirs, ":"))
}

func withoutCommand(env []string) []string {
	kept := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "CNI_COMMAND=") {
			kept = append(kept, kv)
		}
	}
	return kept
}

// parseResult reads a result of the version the plugin wrote, or, when it
// names none, of the config's, and converts it to the current version.
func parseResult(netconf, out []byte) (*current.Result, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(out, &fields); err != nil {
		return nil, err
	}
	if _, ok := fields["cniVersion"]; !ok {
		var conf struct {
			CNIVersion json.RawMessage `json:"cniVersion"`
		}
		if err := json.Unmarshal(netconf, &conf); err != nil {
			return nil, err
		}
		fields["cniVersion"] = conf.CNIVersion
		var err error
		if out, err = json.Marshal(fields); err != nil {
			return nil, err
		}
	}
	version, err := create.DecodeVersion(out)
	if err != nil {
		return nil, err
	}
	result, err := create.Create(version, out)
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(result)
}
