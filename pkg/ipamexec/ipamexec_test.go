package ipamexec_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/napitap/napitap/pkg/ipamexec"
)

// plugin writes an IPAM plugin named name into a CNI_PATH of its own: a shell
// script that records its CNI_COMMAND and stdin, then runs body.
func plugin(t *testing.T, name, body string) (record string) {
	t.Helper()
	dir := t.TempDir()
	record = filepath.Join(dir, "record")
	script := "#!/bin/sh\necho \"$CNI_COMMAND $CNI_CONTAINERID\" >" + record + "\ncat >>" + record + "\n" + body + "\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CNI_PATH", "/nonexistent:"+dir)
	return record
}

const netconf = `{"cniVersion":"1.1.0","name":"n","type":"napitap","ipam":{"type":"fake-ipam"}}`

func TestEachCommandRunsThePluginWithTheConfigAndTheCallersEnvironment(t *testing.T) {
	record := plugin(t, "fake-ipam", `echo '{"cniVersion":"1.1.0","ips":[{"address":"10.1.2.3/24"}]}'`)
	t.Setenv("CNI_COMMAND", "VERSION") // napitap's own, replaced
	t.Setenv("CNI_CONTAINERID", "ctr1")
	ctx := context.Background()
	for _, tc := range []struct {
		command string
		run     func() error
	}{
		{"ADD", func() error { _, err := ipamexec.Add(ctx, "fake-ipam", []byte(netconf)); return err }},
		{"DEL", func() error { return ipamexec.Del(ctx, "fake-ipam", []byte(netconf)) }},
		{"CHECK", func() error { return ipamexec.Check(ctx, "fake-ipam", []byte(netconf)) }},
		{"STATUS", func() error { return ipamexec.Status(ctx, "fake-ipam", []byte(netconf)) }},
		{"GC", func() error { return ipamexec.GC(ctx, "fake-ipam", []byte(netconf)) }},
	} {
		if err := tc.run(); err != nil {
			t.Fatalf("%s: %v", tc.command, err)
		}
		got, err := os.ReadFile(record)
		if err != nil {
			t.Fatal(err)
		}
		if want := tc.command + " ctr1\n" + netconf; string(got) != want {
			t.Errorf("%s: the plugin saw %q, want %q", tc.command, got, want)
		}
	}
}

func TestAddConvertsTheResultToTheCurrentVersion(t *testing.T) {
	for _, tc := range []struct {
		name, out string
	}{
		{"a result of the config's version", `{"cniVersion":"1.1.0","ips":[{"address":"10.1.2.3/24","gateway":"10.1.2.1"}]}`},
		{"a 0.4.0 result", `{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.2.3/24","gateway":"10.1.2.1"}]}`},
		{"a result naming no version takes the config's", `{"ips":[{"address":"10.1.2.3/24","gateway":"10.1.2.1"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plugin(t, "fake-ipam", "echo '"+tc.out+"'")
			res, err := ipamexec.Add(context.Background(), "fake-ipam", []byte(netconf))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.1.2.3/24" || res.IPs[0].Gateway.String() != "10.1.2.1" {
				t.Errorf("result %+v", res)
			}
		})
	}
}

func TestFailuresSayWhichPluginAndWhy(t *testing.T) {
	for _, tc := range []struct {
		name     string
		plugin   string // "" for none on CNI_PATH
		wantCode uint   // 0: not a CNI error
		want     []string
		notFound bool
		maxLen   int // of the message; 0: any
	}{
		{
			name:     "a CNI error keeps the plugin's code and message",
			plugin:   `echo '{"cniVersion":"1.1.0","code":11,"msg":"no addresses left in range"}'; exit 1`,
			wantCode: types.ErrTryAgainLater,
			want:     []string{`ipam "fake-ipam": ADD: no addresses left in range`},
		},
		{
			name:   "a crash without JSON gives its stderr",
			plugin: `echo 'panic: boom' >&2; exit 2`,
			want:   []string{`ipam "fake-ipam": ADD`, "exit status 2", "panic: boom"},
		},
		{
			name:   "a result that is not JSON is named as the result",
			plugin: `echo 'not json'`,
			want:   []string{`ipam "fake-ipam": result`},
		},
		{
			name:   "a flood on stderr is quoted only in its first 4 KiB",
			plugin: `head -c 1000000 /dev/zero | tr '\0' x >&2; exit 2`,
			want:   []string{`ipam "fake-ipam": ADD`, "exit status 2", "xxxx"},
			maxLen: 4<<10 + 100,
		},
		{
			name:     "a plugin missing from CNI_PATH is ErrNotFound naming the path",
			want:     []string{`ipam "fake-ipam": not found in CNI_PATH`, "/nonexistent"},
			notFound: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.plugin != "" {
				plugin(t, "fake-ipam", tc.plugin)
			} else {
				t.Setenv("CNI_PATH", "/nonexistent")
			}
			_, err := ipamexec.Add(context.Background(), "fake-ipam", []byte(netconf))
			if err == nil {
				t.Fatal("ADD succeeded")
			}
			var cniErr *types.Error
			if isCNI := errors.As(err, &cniErr); isCNI != (tc.wantCode != 0) || (isCNI && cniErr.Code != tc.wantCode) {
				t.Errorf("error %#v, want code %d", err, tc.wantCode)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if tc.maxLen != 0 && len(err.Error()) > tc.maxLen {
				t.Errorf("error of %d bytes (%q), want at most %d", len(err.Error()), short(err), tc.maxLen)
			}
			if errors.Is(err, ipamexec.ErrNotFound) != tc.notFound {
				t.Errorf("errors.Is(%v, ErrNotFound) = %v", err, !tc.notFound)
			}
		})
	}
}

func TestAPluginNameIsNotAPath(t *testing.T) {
	t.Setenv("CNI_PATH", t.TempDir())
	for _, name := range []string{"../../bin/sh", "/bin/true", ""} {
		if err := ipamexec.Del(context.Background(), name, []byte(netconf)); err == nil || !strings.Contains(err.Error(), "not a plugin name") {
			t.Errorf("Del(%q): %v", name, err)
		}
	}
}

// The same check catches napitap run again beneath its own IPAM plugin, as
// happens when an IPAM plugin hands the call back to napitap (issue 19).
func TestNapitapBeneathAnIPAMPluginRefusesToExecAnother(t *testing.T) {
	record := plugin(t, "fake-ipam", `echo '{"cniVersion":"1.1.0","ips":[]}'`)
	t.Setenv("NAPITAP_UNDER_IPAM", "hands-back")
	ctx := context.Background()
	for _, tc := range []struct {
		command string
		run     func() error
	}{
		{"ADD", func() error { _, err := ipamexec.Add(ctx, "fake-ipam", []byte(netconf)); return err }},
		{"DEL", func() error { return ipamexec.Del(ctx, "fake-ipam", []byte(netconf)) }},
		{"CHECK", func() error { return ipamexec.Check(ctx, "fake-ipam", []byte(netconf)) }},
		{"STATUS", func() error { return ipamexec.Status(ctx, "fake-ipam", []byte(netconf)) }},
		{"GC", func() error { return ipamexec.GC(ctx, "fake-ipam", []byte(netconf)) }},
	} {
		err := tc.run()
		var cniErr *types.Error
		if !errors.As(err, &cniErr) || cniErr.Code != types.ErrInvalidNetworkConfig || !strings.HasPrefix(cniErr.Msg, "ipam.type: ") || !strings.Contains(cniErr.Msg, `"hands-back"`) {
			t.Errorf("%s: %v, want code 7 naming ipam.type and the plugin above", tc.command, err)
		}
		if _, err := os.Stat(record); err == nil {
			t.Fatalf("%s: the plugin ran", tc.command)
		}
	}
}

func TestThePluginsEnvironmentNamesItAsNapitapsIPAM(t *testing.T) {
	seen := filepath.Join(t.TempDir(), "seen")
	plugin(t, "fake-ipam", `echo "$NAPITAP_UNDER_IPAM" >`+seen)
	if err := ipamexec.Del(context.Background(), "fake-ipam", []byte(netconf)); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(seen); string(got) != "fake-ipam\n" {
		t.Errorf("the plugin saw NAPITAP_UNDER_IPAM %q, want its own name", got)
	}
}

func TestAPluginThatHangsOrFloodsIsKilledWithItsChildren(t *testing.T) {
	for _, tc := range []struct {
		name     string
		body     string // writes its pids to $PIDS
		wantCode uint   // 0: not a CNI error
		want     string
	}{
		{
			name:     "a plugin that hangs with a child dies with it at the timeout, as try again later",
			body:     `sleep 600 & echo $$ $! >"$PIDS"; sleep 600`,
			wantCode: types.ErrTryAgainLater,
			want:     `ipam "fake-ipam": ADD: no answer within `,
		},
		{
			name: "a plugin that prints without end dies at 1 MiB",
			body: `echo $$ >"$PIDS"; while :; do head -c 65536 /dev/zero; done`,
			want: `ipam "fake-ipam": ADD: more than 1 MiB on stdout; killed its process group`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plugin(t, "fake-ipam", tc.body)
			pidFile := filepath.Join(t.TempDir(), "pids")
			t.Setenv("PIDS", pidFile)
			t.Cleanup(func() { killAll(pidFile) }) // what the code before left
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			done := make(chan error, 1)
			go func() { _, err := ipamexec.Add(ctx, "fake-ipam", []byte(netconf)); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				killAll(pidFile)
				t.Fatalf("ADD still running after 10 s")
			}
			t.Logf("error after %v", time.Since(start).Round(time.Millisecond))
			if err == nil {
				t.Fatal("ADD succeeded")
			}
			msg := short(err)
			var cniErr *types.Error
			if isCNI := errors.As(err, &cniErr); isCNI != (tc.wantCode != 0) || (isCNI && cniErr.Code != tc.wantCode) {
				t.Errorf("error %q, want code %d", msg, tc.wantCode)
			}
			for _, w := range []string{tc.want, "killed its process group"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
			// SIGKILL is delivered at once, but a process is gone only
			// once it has run its exit.
			deadline := time.Now().Add(2 * time.Second)
			for left := alive(pidFile); len(left) > 0; left = alive(pidFile) {
				if time.Now().After(deadline) {
					t.Fatalf("processes %v of the plugin still alive", left)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// short is err's message, cut for the log: the code before quoted all of
// a plugin's output.
func short(err error) string {
	if msg := err.Error(); len(msg) > 300 {
		return msg[:300] + "..."
	}
	return err.Error()
}

// alive: the pids in file that still run (a zombie has finished).
func alive(file string) []int {
	raw, _ := os.ReadFile(file)
	var pids []int
	for _, f := range strings.Fields(string(raw)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := bytes.LastIndexByte(stat, ')'); err == nil && i > 0 && i+2 < len(stat) && stat[i+2] != 'Z' {
			pids = append(pids, pid)
		}
	}
	return pids
}

func killAll(file string) {
	for _, pid := range alive(file) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
