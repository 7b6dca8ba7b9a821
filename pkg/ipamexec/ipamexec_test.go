package ipamexec_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
