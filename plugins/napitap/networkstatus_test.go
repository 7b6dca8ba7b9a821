package main_test

import (
	"crypto/sha256"
	"fmt"
	"regexp"
	"slices"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/napitap/napitap/internal/cnitest"
)

// networkStatus is an entry of the k8s.v1.cni.cncf.io/network-status
// annotation, the fields KubeVirt reads.
type networkStatus struct {
	Name      string
	Interface string
	IPs       []string
	Mac       string
}

// multusNetworkStatuses builds a secondary network's network-status entries
// from its CNI result as Multus v4.2.2 does (it calls
// network-attachment-definition-client v1.7.6 pkg/utils/net-attach-def.go
// CreateNetworkStatuses): one entry per result interface with a sandbox, in
// the result's order, with that interface's name and MAC; each IP goes to
// the entry of the interface it names, an IP naming none to the last entry.
// A result of one interface takes CreateNetworkStatus instead: one entry,
// named after the last interface with a sandbox, with every IP.
func multusNetworkStatuses(res *current.Result, network string) []networkStatus {
	var statuses []networkStatus
	entryOf := map[int]int{}
	for i, iface := range res.Interfaces {
		if iface.Sandbox == "" {
			continue
		}
		entryOf[i] = len(statuses)
		statuses = append(statuses, networkStatus{Name: network, Interface: iface.Name, Mac: iface.Mac})
	}
	if len(res.Interfaces) == 1 {
		s := networkStatus{Name: network}
		if len(statuses) == 1 {
			s = statuses[0]
		}
		for _, ipc := range res.IPs {
			s.IPs = append(s.IPs, ipc.Address.IP.String())
		}
		return []networkStatus{s}
	}
	for _, ipc := range res.IPs {
		if ipc.Interface == nil {
			if len(statuses) > 0 {
				statuses[len(statuses)-1].IPs = append(statuses[len(statuses)-1].IPs, ipc.Address.IP.String())
			}
			continue
		}
		if e, ok := entryOf[*ipc.Interface]; ok {
			statuses[e].IPs = append(statuses[e].IPs, ipc.Address.IP.String())
		}
	}
	return statuses
}

// kubevirtLookup finds a pod interface's entry as KubeVirt does: a map by
// interface name, so the last entry of that name wins (kubevirt
// pkg/network/multus/status.go NetworkStatusesByPodIfaceName, v1.5.0 to
// v1.9.0; NonDefaultMultusNetworksIndexedByIfaceName in
// pkg/virt-controller/services/multus_annotations.go, v1.1.1).
func kubevirtLookup(statuses []networkStatus, podIface string) (networkStatus, bool) {
	byName := map[string]networkStatus{}
	for _, s := range statuses {
		byName[s.Interface] = s
	}
	s, ok := byName[podIface]
	return s, ok
}

// kubevirtOrdinal is KubeVirt's test for the older pod interface names
// (net1, net2, ...): any entry so named makes it name every secondary pod
// interface that way (pkg/network/namescheme PodHasOrdinalInterfaceName).
var kubevirtOrdinal = regexp.MustCompile(`^net\d+$`)

// Multus lists a chained napitap network three times: the pod interface
// (no address), the tap, and the guest NIC under the pod interface's name
// with the guest's MAC and every address. KubeVirt indexes the entries by
// name, so it must find the guest's entry, which napitap lists last; the
// tap's entry must not change the naming scheme KubeVirt infers.
func TestKubeVirtReadsTheGuestsEntryFromMultusNetworkStatus(t *testing.T) {
	hashed := fmt.Sprintf("pod%x", sha256.Sum256([]byte("napitap")))[:14]
	for _, tc := range []struct {
		name    string
		plugins func(e *cnitest.Env) []string
		ifName  string
	}{
		{
			name: "tc-redirect behind bridge on a hashed pod interface",
			plugins: func(e *cnitest.Env) []string {
				return []string{e.BridgePlugin(), `{"type":"napitap","handoff":{"mode":"off"}}`}
			},
			ifName: hashed,
		},
		{
			name: "tc-redirect behind bridge on an ordinal pod interface",
			plugins: func(e *cnitest.Env) []string {
				return []string{e.BridgePlugin(), `{"type":"napitap","handoff":{"mode":"off"}}`}
			},
			ifName: "net1",
		},
		{
			name: "tc-redirect behind ptp on a hashed pod interface",
			plugins: func(e *cnitest.Env) []string {
				return []string{e.PtpPlugin(), `{"type":"napitap","handoff":{"mode":"off"}}`}
			},
			ifName: hashed,
		},
		{
			name: "bridge wiring behind bridge on a hashed pod interface",
			plugins: func(e *cnitest.Env) []string {
				return []string{e.BridgePlugin(), `{"type":"napitap","wiring":"bridge","handoff":{"mode":"off"}}`}
			},
			ifName: hashed,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			list := e.List("1.0.0", tc.plugins(e)...)
			rt := e.RT(tc.ifName)
			res := e.MustAdd(list, rt)
			t.Cleanup(func() {
				if err := e.Del(list, rt); err != nil {
					t.Errorf("DEL: %v", err)
				}
			})

			// The pod interface's MAC before napitap: the previous
			// plugin's entry, which the guest takes over.
			podIdx := slices.IndexFunc(res.Interfaces, func(i *current.Interface) bool {
				return i.Name == tc.ifName && i.Sandbox == e.Pod.Path()
			})
			if podIdx < 0 {
				t.Fatalf("no pod interface %s in %s", tc.ifName, cnitest.MustJSON(res))
			}
			var addrs []string
			for _, ipc := range res.IPs {
				addrs = append(addrs, ipc.Address.IP.String())
			}
			if len(addrs) == 0 {
				t.Fatalf("the result has no address: %s", cnitest.MustJSON(res))
			}

			statuses := multusNetworkStatuses(res, list.Name)
			t.Logf("network-status: %+v", statuses)
			got, ok := kubevirtLookup(statuses, tc.ifName)
			if !ok {
				t.Fatalf("KubeVirt finds no entry for %s", tc.ifName)
			}
			if got.Mac != res.Interfaces[podIdx].Mac || !slices.Equal(got.IPs, addrs) || got.Name != list.Name {
				t.Errorf("KubeVirt reads %+v for %s, want the guest's: MAC %s, IPs %v, network %s", got, tc.ifName, res.Interfaces[podIdx].Mac, addrs, list.Name)
			}
			for _, s := range statuses {
				if s.Interface != tc.ifName && kubevirtOrdinal.MatchString(s.Interface) {
					t.Errorf("entry %s would make KubeVirt take ordinal pod interface names", s.Interface)
				}
			}
		})
	}
}
