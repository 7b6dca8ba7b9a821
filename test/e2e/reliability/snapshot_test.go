package reliability

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/pkg/katadan"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// nodeSnapshot is everything of a node napitap could leave behind, in a
// form two snapshots can be compared in: "nothing left" means equal to the
// snapshot taken before ADD.
type nodeSnapshot struct {
	// Host and Pods: links (name, type, master; MAC in pods), their
	// addresses but link-local ones, qdiscs and tc filters, per netns. A pod netns that no longer exists is "gone".
	Host []string
	Pods map[string][]string
	// State: file names in napitapd's state dir.
	State []string
	// DAN: each DAN file with its devices.
	DAN []string
	// IPAM: host-local's reservations (its lock and last_reserved_ip.*
	// files are bookkeeping that outlives every attachment).
	IPAM []string
	// Attachments: napitapd's List, "container/ifname held=N".
	Attachments []string
	// FDs: napitapd's open fds by kind ("/dev/net/tun", "socket", "net"
	// for a netns handle, ...) with counts.
	FDs []string
	// NumFDs is the total of FDs; RSSKiB is napitapd's VmRSS. Neither is
	// compared: FDs says more, and RSS is reported, not matched.
	NumFDs int
	RSSKiB int64
}

// snapshot takes a nodeSnapshot of f's host netns, the given pod netns,
// napitapd, the DAN dir and host-local's data dir.
func (f *fixture) snapshot(pods ...*podNS) nodeSnapshot {
	f.t.Helper()
	s := nodeSnapshot{Pods: map[string][]string{}}
	var err error
	if s.Host, err = netnsObjects(f.env.Host.Path(), false); err != nil {
		f.t.Fatalf("snapshot of the host netns: %v", err)
	}
	for _, p := range pods {
		if !p.Exists() {
			s.Pods[p.Name] = []string{"gone"}
			continue
		}
		objs, err := netnsObjects(p.Path, true)
		if err != nil {
			if !p.Exists() {
				objs = []string{"gone"}
			} else {
				f.t.Fatalf("snapshot of netns %s: %v", p.Name, err)
			}
		}
		s.Pods[p.Name] = objs
	}
	s.State = dirFiles(f.d.StateDir, nil)
	s.DAN = danFiles(f.danDir)
	bookkeeping := regexp.MustCompile(`(^|/)(lock|last_reserved_ip\.\d+)$`)
	s.IPAM = dirFiles(f.ipamDir, bookkeeping)
	pid := f.d.PID()
	if pid != 0 {
		s.FDs, s.NumFDs = settledFDs(pid)
		s.RSSKiB = procRSS(pid)
	} else {
		s.FDs = []string{"napitapd down"}
	}
	if atts, err := f.d.Client().List(); err != nil {
		s.Attachments = []string{"napitapd unreachable"}
	} else {
		for _, a := range atts {
			s.Attachments = append(s.Attachments, fmt.Sprintf("%s held=%d", a.Key, a.Held))
		}
	}
	return s
}

// fieldDiff is one field in which two snapshots differ.
type fieldDiff struct {
	Field          string
	Have, Want     []string
	Extra, Missing []string
}

func (d fieldDiff) String() string {
	return fmt.Sprintf("%s: have %q, want %q (extra %q, missing %q)", d.Field, d.Have, d.Want, d.Extra, d.Missing)
}

// diff names every field in which s differs from want.
func (s nodeSnapshot) diff(want nodeSnapshot) []fieldDiff {
	var out []fieldDiff
	cmp := func(field string, have, want []string) {
		if !slices.Equal(have, want) {
			out = append(out, fieldDiff{field, have, want, minus(have, want), minus(want, have)})
		}
	}
	cmp("host netns", s.Host, want.Host)
	names := map[string]bool{}
	for n := range s.Pods {
		names[n] = true
	}
	for n := range want.Pods {
		names[n] = true
	}
	for _, n := range sortedKeys(names) {
		cmp("pod netns "+n, s.Pods[n], want.Pods[n])
	}
	cmp("napitapd state dir", s.State, want.State)
	cmp("DAN dir", s.DAN, want.DAN)
	cmp("host-local reservations", s.IPAM, want.IPAM)
	cmp("napitapd attachments", s.Attachments, want.Attachments)
	cmp("napitapd fds", s.FDs, want.FDs)
	return out
}

// requireSame waits (kernel netns teardown and napitapd closing a finished
// connection are asynchronous) until the node looks like want again.
func (f *fixture) requireSame(want nodeSnapshot, what string, pods ...*podNS) nodeSnapshot {
	f.t.Helper()
	start := time.Now()
	for {
		have := f.snapshot(pods...)
		var left []string
		for _, d := range have.diff(want) {
			left = append(left, d.String())
		}
		if len(left) == 0 {
			if os.Getenv("NAPITAP_DEBUG") != "" {
				f.t.Logf("%s: same after %v", what, time.Since(start))
			}
			return have
		}
		if time.Since(start) > 10*time.Second {
			f.t.Fatalf("%s: the node is not as it was:\n  %s", what, strings.Join(left, "\n  "))
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// netnsObjects describes the links, qdiscs and tc filters of a netns.
func netnsObjects(path string, withMAC bool) ([]string, error) {
	var out []string
	err := inNetns(path, func() error {
		links, err := netlinksafe.LinkList()
		if err != nil {
			return err
		}
		names := map[int]string{}
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		for _, l := range links {
			a := l.Attrs()
			desc := fmt.Sprintf("link %s type=%s", a.Name, l.Type())
			if a.MasterIndex != 0 {
				desc += " master=" + names[a.MasterIndex]
			}
			if withMAC {
				desc += " mac=" + a.HardwareAddr.String()
			}
			out = append(out, desc)
			addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
			if err != nil {
				return err
			}
			for _, ad := range addrs {
				if !ad.IP.IsLinkLocalUnicast() {
					out = append(out, fmt.Sprintf("addr %s %s", a.Name, ad.IPNet))
				}
			}
			for _, parent := range []struct {
				name   string
				handle uint32
			}{{"ingress", netlink.HANDLE_MIN_INGRESS}, {"egress", netlink.HANDLE_MIN_EGRESS}} {
				filters, err := netlinksafe.FilterList(l, parent.handle)
				if err != nil {
					continue // no clsact: nothing to list
				}
				for _, fl := range filters {
					fa := fl.Attrs()
					mark := ""
					if fa.Priority == tapsetup.RedirectPriority {
						mark = " napitap"
					}
					out = append(out, fmt.Sprintf("filter %s %s %s prio=%d%s", a.Name, parent.name, fl.Type(), fa.Priority, mark))
				}
			}
		}
		qdiscs, err := netlinksafe.QdiscList(nil)
		if err != nil {
			return err
		}
		for _, q := range qdiscs {
			qa := q.Attrs()
			out = append(out, fmt.Sprintf("qdisc %s %s parent=%s", names[qa.LinkIndex], q.Type(), netlink.HandleStr(qa.Parent)))
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// dirFiles lists the files under dir, relative, skipping those skip
// matches. A missing dir is empty.
func dirFiles(dir string, skip *regexp.Regexp) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		if skip == nil || !skip.MatchString(rel) {
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// danFiles lists the DAN files with the devices each holds.
func danFiles(dir string) []string {
	var out []string
	for _, name := range dirFiles(dir, nil) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		var file katadan.File
		if err == nil {
			err = json.Unmarshal(b, &file)
		}
		if err != nil {
			out = append(out, name+": unreadable")
			continue
		}
		var devs []string
		for _, d := range file.Devices {
			devs = append(devs, d.Name+"="+d.Device.TapName)
		}
		out = append(out, name+": "+strings.Join(devs, ","))
	}
	return out
}

// procFDs counts a process's open fds by kind. A unix socket is
// "listening <path>" or "connection"; the other kinds are readlink's,
// inode numbers dropped ("net" is a netns handle).
func procFDs(pid int) ([]string, int) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return []string{"unreadable: " + err.Error()}, 0
	}
	unixSockets := unixSocketTable(pid)
	kinds := map[string]int{}
	inode := regexp.MustCompile(`^([a-z_]+):\[?([^\]]*)\]?$`)
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if m := inode.FindStringSubmatch(target); m != nil {
			switch m[1] {
			case "socket":
				if desc, ok := unixSockets[m[2]]; ok {
					target = "unix socket " + desc
				} else {
					target = "socket"
				}
			case "anon_inode":
				target = "anon_inode:" + m[2]
			default:
				target = m[1]
			}
		}
		kinds[target]++
	}
	var out []string
	n := 0
	for _, k := range sortedKeys(kinds) {
		out = append(out, fmt.Sprintf("%s x%d", k, kinds[k]))
		n += kinds[k]
	}
	return out, n
}

// unixSocketTable maps the inodes of the unix sockets in pid's netns to
// "listening <path>" or "connection".
func unixSocketTable(pid int) map[string]string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode [Path]
		fields := strings.Fields(line)
		if len(fields) < 7 {
			continue
		}
		desc := "connection"
		if fields[3] == "00010000" && len(fields) > 7 {
			desc = "listening " + fields[7]
		}
		out[fields[6]] = desc
	}
	return out
}

// settledFDs reads napitapd's fds once the server side of a finished
// request has gone: the connection napitapd closes when it reads EOF, and
// the peer's pidfd it holds for as long. The fds are read one by one, so a
// connection that closes meanwhile can leave half of itself in one read:
// two reads in a row must agree.
func settledFDs(pid int) ([]string, int) {
	perConn := func(k string) bool {
		return strings.HasPrefix(k, "unix socket connection") || strings.HasPrefix(k, "anon_inode:pidfd")
	}
	deadline := time.Now().Add(2 * time.Second)
	last, _ := procFDs(pid)
	for {
		time.Sleep(2 * time.Millisecond)
		kinds, n := procFDs(pid)
		if (!slices.ContainsFunc(kinds, perConn) && slices.Equal(kinds, last)) || time.Now().After(deadline) {
			return kinds, n
		}
		last = kinds
	}
}

// procRSS is VmRSS in KiB.
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return v
		}
	}
	return -1
}

// tunFDs is how many tap queues napitapd holds open.
func tunFDs(pid int) int {
	kinds, _ := procFDs(pid)
	for _, k := range kinds {
		if n, ok := strings.CutPrefix(k, "/dev/net/tun x"); ok {
			v, _ := strconv.Atoi(n)
			return v
		}
	}
	return 0
}

func minus(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// podObjects is the pod part of a snapshot, for assertions in between.
func podObjects(t testing.TB, p *podNS) []string {
	t.Helper()
	objs, err := netnsObjects(p.Path, true)
	if err != nil {
		t.Fatalf("netns %s: %v", p.Name, err)
	}
	return objs
}
