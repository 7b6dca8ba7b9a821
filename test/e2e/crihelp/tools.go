package crihelp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/nstest"
)

// RepoRoot is the root of napitap's module: the nearest directory up from
// the working directory (a test's package dir) whose go.mod is napitap's.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/napitap/napitap\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside napitap's module")
		}
		dir = parent
	}
}

// RequireTools fails the test unless every tool is on PATH.
func RequireTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: run hack/deps.sh (%v)", tool, err)
		}
	}
}

// LinkNames lists the names of every link in netns, sorted.
func LinkNames(t testing.TB, netns *nstest.NetNS) []string {
	t.Helper()
	var names []string
	netns.Run(t, func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
		return err
	})
	slices.Sort(names)
	return names
}

// BuildCrictl returns the cached crictl, building it first (about a
// minute) through hack/crictl.sh, which pins its version.
func BuildCrictl(t testing.TB) string {
	t.Helper()
	repo, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cmd := exec.Command("bash", filepath.Join(repo, "hack", "crictl.sh"), "--path")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/crictl.sh --path: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("built crictl in %v", d.Round(time.Second))
	}
	return strings.TrimSpace(string(out))
}

// Sandbox is what `crictl inspectp` says of a pod sandbox.
type Sandbox struct {
	ID    string
	State string // SANDBOX_READY or SANDBOX_NOTREADY
	IP    net.IP
	NetNS string // the netns path from the OCI spec containerd ran it with
}

// InspectSandbox asks the CRI about sandbox id.
func (n *Node) InspectSandbox(id string) (*Sandbox, error) {
	out, err := n.CrictlRun("inspectp", "-o", "json", id)
	if err != nil {
		return nil, err
	}
	var inspect struct {
		Status struct {
			ID      string
			State   string
			Network struct{ IP string }
		}
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct{ Type, Path string }
				}
			}
		}
	}
	if err := json.Unmarshal(out, &inspect); err != nil {
		return nil, fmt.Errorf("crictl inspectp %s: %v", id, err)
	}
	sb := &Sandbox{ID: inspect.Status.ID, State: inspect.Status.State, IP: net.ParseIP(inspect.Status.Network.IP)}
	for _, ns := range inspect.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			sb.NetNS = ns.Path
		}
	}
	if sb.NetNS == "" {
		return sb, fmt.Errorf("sandbox %.12s: no network namespace path in its runtime spec: %s", id, Tail(string(out), 2000))
	}
	return sb, nil
}
