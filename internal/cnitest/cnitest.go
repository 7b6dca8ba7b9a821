// Package cnitest drives CNI plugins through libcni the way a runtime
// does, against real network namespaces, for napitap's tests and e2e.
package cnitest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// ReferencePlugins are the upstream plugins napitap chains after, built from
// the Go module proxy at the versions go.mod pins.
var ReferencePlugins = []string{
	"github.com/containernetworking/plugins/plugins/main/bridge",
	"github.com/containernetworking/plugins/plugins/main/ptp",
	"github.com/containernetworking/plugins/plugins/ipam/host-local",
}

// MainWithBinaries is a TestMain body: it builds pkgs into a temp dir,
// stores the dir in *binDir, runs the tests and removes the dir.
func MainWithBinaries(m *testing.M, binDir *string, pkgs ...string) {
	dir, err := Build(pkgs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// PrebuiltEnv names a directory of binaries built beforehand, where there
// is no Go toolchain (make test-kernel's guest): Build then copies each
// package's binary, named by the last element of its path, from there.
const PrebuiltEnv = "NAPITAP_PREBUILT_BIN"

// Build compiles pkgs (import paths or ./dirs relative to the working
// directory) into a new temp dir and returns it; the caller removes it.
// Static, as make build and the image build them: with cgo, Go links
// napitapd's os/user to libc's NSS and every binary to the dynamic loader,
// which costs each exec about 0.8 ms of CPU that no shipped binary pays.
func Build(pkgs ...string) (string, error) {
	dir, err := os.MkdirTemp("", "napitap-bin-")
	if err != nil {
		return "", err
	}
	if pre := os.Getenv(PrebuiltEnv); pre != "" {
		for _, p := range pkgs {
			name := filepath.Base(p)
			if abs, err := filepath.Abs(p); err == nil && strings.HasPrefix(p, ".") {
				name = filepath.Base(abs) // "." is the working directory's package
			}
			b, err := os.ReadFile(filepath.Join(pre, name))
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name), b, 0o755)
			}
			if err != nil {
				os.RemoveAll(dir)
				return "", fmt.Errorf("%s=%s: %w", PrebuiltEnv, pre, err)
			}
		}
		return dir, nil
	}
	cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go build %v: %w", pkgs, err)
	}
	return dir, nil
}

// env is one runtime host (a netns of its own, where bridge/ptp put their
// host side) and one pod netns, driven through libcni as a runtime would.
type Env struct {
	t           testing.TB
	Host, Pod   *nstest.NetNS
	CNI         *libcni.CNIConfig
	BinDir      string
	Suffix      string
	ContainerID string
	DataDir     string
	Subnet      string
}

// NewEnv makes a host and a pod netns and a libcni that execs e.BinDir.
func NewEnv(t testing.TB, binDir string) *Env {
	t.Helper()
	nstest.RequireRoot(t)
	e := &Env{t: t, Host: nstest.New(t, "host"), Pod: nstest.New(t, "pod"), Suffix: nstest.RandomSuffix(), BinDir: binDir}
	e.ContainerID = "napitap-test-" + e.Suffix
	e.DataDir = t.TempDir()
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(e.DataDir, "cache"), nil)
	e.Subnet = "10.199.0.0/24"
	e.Host.Run(t, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	return e
}

// Plugin configs, as JSON objects to put in a conflist.
func (e *Env) BridgePlugin() string {
	return fmt.Sprintf(`{"type":"bridge","bridge":"napibr-%s","isGateway":true,"ipam":{"type":"host-local","subnet":%q,"dataDir":%q}}`,
		e.Suffix, e.Subnet, filepath.Join(e.DataDir, "ipam"))
}

func (e *Env) PtpPlugin() string {
	return fmt.Sprintf(`{"type":"ptp","ipam":{"type":"host-local","subnet":%q,"dataDir":%q}}`, e.Subnet, filepath.Join(e.DataDir, "ipam"))
}

func (e *Env) Ipam() string {
	return fmt.Sprintf(`{"type":"host-local","subnet":%q,"dataDir":%q}`, e.Subnet, filepath.Join(e.DataDir, "ipam"))
}

func (e *Env) List(version string, plugins ...string) *libcni.NetworkConfigList {
	e.t.Helper()
	return e.ListNamed("napitap-test", version, plugins...)
}

// ListNamed is List for a network of another name.
func (e *Env) ListNamed(name, version string, plugins ...string) *libcni.NetworkConfigList {
	e.t.Helper()
	raw := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[%s]}`, version, name, strings.Join(plugins, ","))
	list, err := libcni.ConfListFromBytes([]byte(raw))
	if err != nil {
		e.t.Fatalf("conflist %s: %v", raw, err)
	}
	return list
}

func (e *Env) RT(ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: e.ContainerID, NetNS: e.Pod.Path(), IfName: ifName}
}

// inHost runs fn in the host netns, so plugins exec'd from it act there.
func (e *Env) InHost(fn func() error) error {
	return e.Host.Do(func(ns.NetNS) error { return fn() })
}

func (e *Env) Add(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*current.Result, error) {
	var res types.Result
	err := e.InHost(func() (err error) {
		res, err = e.CNI.AddNetworkList(context.Background(), list, rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (e *Env) MustAdd(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) *current.Result {
	e.t.Helper()
	res, err := e.Add(list, rt)
	if err != nil {
		e.t.Fatalf("ADD: %v", err)
	}
	return res
}

func (e *Env) Check(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.InHost(func() error { return e.CNI.CheckNetworkList(context.Background(), list, rt) })
}

func (e *Env) GC(list *libcni.NetworkConfigList, valid []types.GCAttachment) error {
	return e.InHost(func() error {
		return e.CNI.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: valid})
	})
}

func (e *Env) Del(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.InHost(func() error { return e.CNI.DelNetworkList(context.Background(), list, rt) })
}

// execNapitap runs the napitap binary alone with conf (prevResult and all),
// for cases a conflist cannot express.
func (e *Env) ExecNapitap(command, conf string, ifName string) error {
	args := &invoke.Args{Command: command, ContainerID: e.ContainerID, NetNS: e.Pod.Path(), IfName: ifName, Path: e.BinDir}
	return e.InHost(func() error {
		_, err := invoke.ExecPluginWithResult(context.Background(), filepath.Join(e.BinDir, "napitap"), []byte(conf), args, nil)
		if command != "ADD" && err != nil && strings.Contains(err.Error(), "unexpected end of JSON input") {
			return nil // DEL and CHECK print nothing
		}
		return err
	})
}

// checkNapitapOnly runs napitap's CHECK alone, with the chain's final
// result as prevResult, as the last plugin of list.
func (e *Env) CheckNapitapOnly(list *libcni.NetworkConfigList, final *current.Result, ifName string) error {
	var plugin map[string]any
	if err := json.Unmarshal(list.Plugins[len(list.Plugins)-1].Bytes, &plugin); err != nil {
		return err
	}
	versioned, err := final.GetAsVersion(list.CNIVersion)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(versioned)
	if err != nil {
		return err
	}
	var prev map[string]any
	if err := json.Unmarshal(raw, &prev); err != nil {
		return err
	}
	plugin["cniVersion"], plugin["name"], plugin["prevResult"] = list.CNIVersion, list.Name, prev
	conf, err := json.Marshal(plugin)
	if err != nil {
		return err
	}
	return e.ExecNapitap("CHECK", string(conf), ifName)
}

// PodLinks lists "name/type/mac" of every link in the pod netns, with
// napitap's tc filters and whether it is enslaved, so tests can say the pod
// is as it was.
func (e *Env) PodLinks() []string {
	e.t.Helper()
	return e.links(e.Pod)
}

// HostLinks is PodLinks for the host netns, where the bridge, the veths'
// host ends and a Kata DAN tap are.
func (e *Env) HostLinks() []string {
	e.t.Helper()
	return e.links(e.Host)
}

func (e *Env) links(netns *nstest.NetNS) []string {
	e.t.Helper()
	var out []string
	netns.Run(e.t, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			desc := l.Attrs().Name + "/" + l.Type() + "/" + l.Attrs().HardwareAddr.String()
			if filters, err := tapsetup.RedirectFilters(l); err == nil && len(filters) > 0 {
				desc += "/redirect"
			}
			if l.Attrs().MasterIndex != 0 {
				desc += "/enslaved"
			}
			out = append(out, desc)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

func (e *Env) InspectTap(name string) *tapsetup.Tap {
	e.t.Helper()
	tap, err := tapsetup.Inspect(e.Pod.Path(), name)
	if err != nil {
		e.t.Fatalf("inspect: %v", err)
	}
	return tap
}

// guestOf returns the guest NIC entry of a result and its IPv4 address.
func GuestOf(t *testing.T, res *current.Result, containerID string) (*current.Interface, *current.IPConfig) {
	t.Helper()
	for i, iface := range res.Interfaces {
		if iface.Sandbox != containerID {
			continue
		}
		for _, ipc := range res.IPs {
			if ipc.Interface != nil && *ipc.Interface == i && ipc.Address.IP.To4() != nil {
				return iface, ipc
			}
		}
		t.Fatalf("guest entry %q has no IPv4 address in %s", iface.Name, MustJSON(res))
	}
	t.Fatalf("no guest entry (sandbox %q) in %s", containerID, MustJSON(res))
	return nil, nil
}

func MustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// cniError digs the plugin's CNI error out of libcni's wrapping.
func CNIError(err error) *types.Error {
	var e *types.Error
	if errors.As(err, &e) {
		return e
	}
	return &types.Error{Msg: fmt.Sprint(err)}
}

func CNICode(err error) uint { return CNIError(err).Code }
