package main_test

import (
	"context"
	"errors"
	"encoding/json"
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

// binDir holds napitap and the reference plugins it chains after, built
// from this module and the Go module proxy by TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "napitap-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", dir+"/", ".",
		"github.com/containernetworking/plugins/plugins/main/bridge",
		"github.com/containernetworking/plugins/plugins/main/ptp",
		"github.com/containernetworking/plugins/plugins/ipam/host-local")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building plugins:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one runtime host (a netns of its own, where bridge/ptp put their
// host side) and one pod netns, driven through libcni as a runtime would.
type env struct {
	t           testing.TB
	host, pod   *nstest.NetNS
	cni         *libcni.CNIConfig
	suffix      string
	containerID string
	dataDir     string
	subnet      string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	nstest.RequireRoot(t)
	e := &env{t: t, host: nstest.New(t, "host"), pod: nstest.New(t, "pod"), suffix: nstest.RandomSuffix()}
	e.containerID = "napitap-test-" + e.suffix
	e.dataDir = t.TempDir()
	e.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(e.dataDir, "cache"), nil)
	e.subnet = "10.199.0.0/24"
	e.host.Run(t, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	return e
}

// Plugin configs, as JSON objects to put in a conflist.
func (e *env) bridgePlugin() string {
	return fmt.Sprintf(`{"type":"bridge","bridge":"napibr-%s","isGateway":true,"ipam":{"type":"host-local","subnet":%q,"dataDir":%q}}`,
		e.suffix, e.subnet, filepath.Join(e.dataDir, "ipam"))
}

func (e *env) ptpPlugin() string {
	return fmt.Sprintf(`{"type":"ptp","ipam":{"type":"host-local","subnet":%q,"dataDir":%q}}`, e.subnet, filepath.Join(e.dataDir, "ipam"))
}

func (e *env) ipam() string {
	return fmt.Sprintf(`{"type":"host-local","subnet":%q,"dataDir":%q}`, e.subnet, filepath.Join(e.dataDir, "ipam"))
}

func (e *env) list(version string, plugins ...string) *libcni.NetworkConfigList {
	e.t.Helper()
	raw := fmt.Sprintf(`{"cniVersion":%q,"name":"napitap-test","plugins":[%s]}`, version, strings.Join(plugins, ","))
	list, err := libcni.ConfListFromBytes([]byte(raw))
	if err != nil {
		e.t.Fatalf("conflist %s: %v", raw, err)
	}
	return list
}

func (e *env) rt(ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: e.containerID, NetNS: e.pod.Path(), IfName: ifName}
}

// inHost runs fn in the host netns, so plugins exec'd from it act there.
func (e *env) inHost(fn func() error) error {
	return e.host.Do(func(ns.NetNS) error { return fn() })
}

func (e *env) add(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*current.Result, error) {
	var res types.Result
	err := e.inHost(func() (err error) {
		res, err = e.cni.AddNetworkList(context.Background(), list, rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (e *env) mustAdd(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) *current.Result {
	e.t.Helper()
	res, err := e.add(list, rt)
	if err != nil {
		e.t.Fatalf("ADD: %v", err)
	}
	return res
}

func (e *env) check(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.inHost(func() error { return e.cni.CheckNetworkList(context.Background(), list, rt) })
}

func (e *env) gc(list *libcni.NetworkConfigList, valid []types.GCAttachment) error {
	return e.inHost(func() error {
		return e.cni.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: valid})
	})
}

func (e *env) del(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.inHost(func() error { return e.cni.DelNetworkList(context.Background(), list, rt) })
}

// execNapitap runs the napitap binary alone with conf (prevResult and all),
// for cases a conflist cannot express.
func (e *env) execNapitap(command, conf string, ifName string) error {
	args := &invoke.Args{Command: command, ContainerID: e.containerID, NetNS: e.pod.Path(), IfName: ifName, Path: binDir}
	return e.inHost(func() error {
		_, err := invoke.ExecPluginWithResult(context.Background(), filepath.Join(binDir, "napitap"), []byte(conf), args, nil)
		if command != "ADD" && err != nil && strings.Contains(err.Error(), "unexpected end of JSON input") {
			return nil // DEL and CHECK print nothing
		}
		return err
	})
}

// checkNapitapOnly runs napitap's CHECK alone, with the chain's final
// result as prevResult, as the last plugin of list.
func (e *env) checkNapitapOnly(list *libcni.NetworkConfigList, final *current.Result, ifName string) error {
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
	return e.execNapitap("CHECK", string(conf), ifName)
}

// podLinks lists "name/type" of every link in the pod netns, with napitap's
// tc filters, so tests can say the pod is as it was.
func (e *env) podLinks() []string {
	e.t.Helper()
	var out []string
	e.pod.Run(e.t, func() error {
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

func (e *env) inspectTap(name string) *tapsetup.Tap {
	e.t.Helper()
	tap, err := tapsetup.Inspect(e.pod.Path(), name)
	if err != nil {
		e.t.Fatalf("inspect: %v", err)
	}
	return tap
}

// guestOf returns the guest NIC entry of a result and its IPv4 address.
func guestOf(t *testing.T, res *current.Result, containerID string) (*current.Interface, *current.IPConfig) {
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
		t.Fatalf("guest entry %q has no IPv4 address in %s", iface.Name, mustJSON(res))
	}
	t.Fatalf("no guest entry (sandbox %q) in %s", containerID, mustJSON(res))
	return nil, nil
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// cniError digs the plugin's CNI error out of libcni's wrapping.
func cniError(err error) *types.Error {
	var e *types.Error
	if errors.As(err, &e) {
		return e
	}
	return &types.Error{Msg: fmt.Sprint(err)}
}

func cniCode(err error) uint { return cniError(err).Code }
