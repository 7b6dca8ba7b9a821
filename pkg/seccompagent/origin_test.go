package seccompagent

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// cri is what runc gets from containerd's CRI for a pod's container.
func cri(ns, name, container string) map[string]string {
	return map[string]string{"io.kubernetes.cri.sandbox-namespace": ns, "io.kubernetes.cri.sandbox-name": name,
		"io.kubernetes.cri.container-name": container}
}

func TestAnOriginIsBoundedWhateverTheSenderNamesItsContainer(t *testing.T) {
	long := strings.Repeat("<", 11000)
	tests := []struct {
		name        string
		annotations map[string]string
		id          string
		want        string // the whole origin, if set
		wantIn      string // part of it, if set
	}{
		{name: "runc's names through CRI are kept as they are", annotations: cri("default", "virt-launcher-vm1", "compute"), id: "c0ffee",
			want: `pod default/virt-launcher-vm1 container "compute" pid 4242`},
		{name: "a container outside CRI is named by its ID", id: "c0ffee", want: "container c0ffee pid 4242"},
		{name: "a listener of no container is named by its sender", want: "pid 4242 (peer pid 1 uid 0 comm runc)"},
		{name: "a sandbox name of 11,000 '<' is cut and leaves room for the container's", annotations: cri("default", long, "compute"),
			wantIn: `container "compute" pid 4242`},
		{name: "a namespace of 11,000 '<' is cut", annotations: cri(long, "vm1", "compute"), wantIn: `/vm1 container "compute" pid 4242`},
		{name: "a container name of 11,000 '<' is cut", annotations: cri("default", "vm1", long), wantIn: "pod default/vm1 container "},
		{name: "a container ID of 11,000 '<' is cut", id: long, wantIn: " pid 4242"},
		{name: "a sandbox name of 11,000 'é' is cut on a rune boundary", annotations: cri("default", strings.Repeat("é", 11000), "compute"),
			wantIn: `é container "compute"`},
		{name: "control characters and what JSON escapes become '?'", annotations: cri("default", "vm\x1b[2J<&>\u2028\xff", "compute"),
			want: `pod default/vm?[2J????? container "compute" pid 4242`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := &specs.ContainerProcessState{Pid: 4242, State: specs.State{ID: tc.id, Annotations: tc.annotations}}
			got := origin(st, "peer pid 1 uid 0 comm runc")
			b, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case len(got) > MaxOrigin || !utf8.ValidString(got):
				t.Errorf("origin of %d bytes (valid UTF-8: %v), want at most %d: %.80q...", len(got), utf8.ValidString(got), MaxOrigin, got)
			case len(b) > 2*MaxOrigin+2:
				t.Errorf("origin of %d bytes of JSON, want at most %d", len(b), 2*MaxOrigin+2)
			case tc.want != "" && got != tc.want:
				t.Errorf("origin %q, want %q", got, tc.want)
			case !strings.Contains(got, tc.wantIn):
				t.Errorf("origin %q, want it to hold %q", got, tc.wantIn)
			}
		})
	}
}

func TestWhatASenderSuppliesReachesTheLogBounded(t *testing.T) {
	const maxLine = 2048
	long := strings.Repeat("<", 11000)
	tests := []struct {
		name string
		line func(t *testing.T) string
	}{
		{name: "the line of a served listener bounds every annotation and the metadata", line: func(t *testing.T) string {
			var log bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&log, nil))
			agent, err := New(&MapRegistry{}, logger, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer agent.Close()
			a := cri(long, long, long)
			a["io.kubernetes.cri.sandbox-id"], a["io.kubernetes.cri.sandbox-uid"] = long, long
			st := &specs.ContainerProcessState{Pid: 4242, Metadata: long,
				State: specs.State{ID: long, Status: specs.ContainerState(long), Annotations: a}}
			peer := "peer pid 1 uid 4242 comm x"
			NewServer(agent, logger, Limits{}).logListener(st, origin(st, peer), peer)
			return log.String()
		}},
		{name: "a refusal bounds the fd names it quotes", line: func(t *testing.T) string {
			_, _, err := parseMessage([]byte(`{"ociVersion":"1","fds":["`+long+`"],"pid":1}`), []int{7})
			if err == nil {
				t.Fatal("a fd of another name taken")
			}
			return err.Error()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if line := tc.line(t); len(line) > maxLine {
				t.Errorf("%d bytes, want at most %d: %.200s...", len(line), maxLine, line)
			}
		})
	}
}
