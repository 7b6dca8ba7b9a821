// Package ipamexec runs the IPAM plugin a network config names, the way the
// CNI spec has a plugin delegate: the plugin's binary found on CNI_PATH, the
// caller's own environment with CNI_COMMAND set, the same config on stdin.
//
// libcni's invoke package does the same, but brings OpenTelemetry and
// net/http with it, and plugins' pkg/ipam brings nftables and iptables: their
// package init cost every napitap exec milliseconds it never used (issue 13).
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

// ErrNotFound: no executable of the plugin's name is on CNI_PATH.
var ErrNotFound = errors.New("not found in CNI_PATH")

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
	path, err := find(plugin)
	if err != nil {
		return nil, fmt.Errorf("ipam %q: %w", plugin, err)
	}
	env := append(withoutCommand(os.Environ()), "CNI_COMMAND="+command)
	var stdout, stderr bytes.Buffer
	for attempt := 0; ; attempt++ {
		stdout.Reset()
		stderr.Reset()
		cmd := exec.CommandContext(ctx, path)
		cmd.Env = env
		cmd.Stdin = bytes.NewReader(netconf)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		// A binary being replaced on the node is briefly busy.
		if !errors.Is(err, syscall.ETXTBSY) || attempt == 4 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil {
		return stdout.Bytes(), nil
	}
	var cniErr types.Error
	if json.Unmarshal(stdout.Bytes(), &cniErr) == nil && cniErr.Code != 0 {
		cniErr.Msg = fmt.Sprintf("ipam %q: %s: %s", plugin, command, cniErr.Msg)
		return nil, &cniErr
	}
	detail := strings.TrimSpace(stderr.String())
	if detail == "" {
		detail = strings.TrimSpace(stdout.String())
	}
	return nil, fmt.Errorf("ipam %q: %s: %w: %s", plugin, command, err, detail)
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
