// Package katadan writes the "directly attachable network" (DAN) files that
// Kata Containers' runtime-rs reads to plug host taps into a sandbox VM:
// /run/kata-containers/dans/<sandbox id>.json, one file per sandbox with a
// list of devices. Several napitap attachments of one sandbox share the
// file, so every change is a locked read-modify-write.
package katadan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/safefile"
)

// DefaultDir is runtime-rs's default dan_conf directory.
const DefaultDir = "/run/kata-containers/dans"

// File is runtime-rs's DanConfig.
type File struct {
	Netns   string   `json:"netns,omitempty"`
	Devices []Device `json:"devices"`
}

// Device is runtime-rs's DanDevice with a host-tap device. Network marks
// the entries napitap wrote, so GC never touches anyone else's; runtime-rs
// ignores the field.
type Device struct {
	Name        string      `json:"name"` // the interface name in the guest
	GuestMAC    string      `json:"guest_mac,omitempty"`
	Device      HostTap     `json:"device"`
	NetworkInfo NetworkInfo `json:"network_info"`

	// napitap's own, for GC after a runtime that never called DEL: which
	// network wrote the entry and how the tap was wired. runtime-rs ignores
	// them.
	Network string `json:"napitap_network,omitempty"`
	Wiring  string `json:"napitap_wiring,omitempty"`
	Bridge  string `json:"napitap_bridge,omitempty"`
	NetnsID uint64 `json:"napitap_netns_id,omitempty"`
}

// HostTap is a tap runtime-rs opens by name in the sandbox netns.
type HostTap struct {
	Type      string `json:"type"` // "host-tap"
	TapName   string `json:"tap_name"`
	QueueNum  int    `json:"queue_num,omitempty"` // queue pairs
	QueueSize int    `json:"queue_size,omitempty"`
}

type NetworkInfo struct {
	Interface Interface `json:"interface"`
	Routes    []Route   `json:"routes"`
	Neighbors []any     `json:"neighbors"`
}

type Interface struct {
	IPAddresses []string `json:"ip_addresses"` // CIDR
	MTU         int      `json:"mtu,omitempty"`
	NType       string   `json:"ntype,omitempty"`
	Flags       uint32   `json:"flags"`
}

type Route struct {
	Dest    string `json:"dest"`
	Gateway string `json:"gateway"`
	Source  string `json:"source"`
	Scope   uint32 `json:"scope"`
}

// Path is the DAN file of sandboxID under dir.
func Path(dir, sandboxID string) string { return filepath.Join(dir, sandboxID+".json") }

// Put adds dev to the sandbox's file, replacing a device of the same name.
func Put(dir, sandboxID, netns string, dev Device) error {
	b, err := json.Marshal(&dev)
	if err != nil {
		return err
	}
	ns, err := json.Marshal(netns)
	if err != nil {
		return err
	}
	return update(dir, sandboxID, func(f *rawFile) {
		// No netns: runtime-rs opens the tap in its own (DESIGN.md fact 18).
		if netns == "" {
			delete(f.fields, "netns")
		} else {
			f.fields["netns"] = ns
		}
		f.devices = append(f.without(dev.Name), b)
	})
}

// Remove drops the device name from the sandbox's file, and the file when
// it has no devices left. A missing dir, file or device is fine.
func Remove(dir, sandboxID, name string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return update(dir, sandboxID, func(f *rawFile) { f.devices = f.without(name) })
}

// rawFile is a DAN file as read. Other writers share it (runtime-rs's own
// device types, fields of later versions): every field but devices, and
// every device napitap does not replace, is written back as the bytes it
// was read as.
type rawFile struct {
	fields  map[string]json.RawMessage // but "devices"
	devices []json.RawMessage
}

func parseRawFile(b []byte) (*rawFile, error) {
	f := &rawFile{fields: map[string]json.RawMessage{}}
	if len(b) == 0 {
		return f, nil
	}
	if err := json.Unmarshal(b, &f.fields); err != nil {
		return nil, err
	}
	if devs, ok := f.fields["devices"]; ok {
		delete(f.fields, "devices")
		if err := json.Unmarshal(devs, &f.devices); err != nil {
			return nil, fmt.Errorf("devices: %w", err)
		}
	}
	return f, nil
}

// without is f's devices but those named name.
func (f *rawFile) without(name string) []json.RawMessage {
	var kept []json.RawMessage
	for _, d := range f.devices {
		var named struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(d, &named) != nil || named.Name != name {
			kept = append(kept, d)
		}
	}
	return kept
}

// encode writes the fields in key order, each value as it was read.
func (f *rawFile) encode() []byte {
	keys := slices.Sorted(maps.Keys(f.fields))
	var b bytes.Buffer
	b.WriteString("{\n")
	for _, k := range keys {
		name, _ := json.Marshal(k)
		fmt.Fprintf(&b, "  %s: %s,\n", name, f.fields[k])
	}
	b.WriteString(`  "devices": [`)
	for i, d := range f.devices {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n    ")
		b.Write(d)
	}
	b.WriteString("\n  ]\n}\n")
	return b.Bytes()
}

// Entry is one device of one sandbox's file.
type Entry struct {
	Sandbox string
	Netns   string
	Device
}

// Stale lists napitap's devices of network that keep does not want.
func Stale(dir, network string, keep func(sandboxID, name string) bool) ([]Entry, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var stale []Entry
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("DAN file %s: %w", p, err)
		}
		f, err := parseRawFile(b)
		if err != nil {
			continue // not ours to judge
		}
		var netns string
		_ = json.Unmarshal(f.fields["netns"], &netns)
		sandbox := filepath.Base(p[:len(p)-len(".json")])
		for _, raw := range f.devices {
			var d Device
			if json.Unmarshal(raw, &d) != nil {
				continue // another writer's device
			}
			if d.Network == network && !keep(sandbox, d.Name) {
				stale = append(stale, Entry{Sandbox: sandbox, Netns: netns, Device: d})
			}
		}
	}
	return stale, nil
}

// update applies change to the sandbox's file under an exclusive lock on
// the directory itself (no lock file to leave behind), writing through a
// temp file and rename so runtime-rs never reads half a file.
func update(dir, sandboxID string, change func(*rawFile)) error {
	if err := safefile.TrustedDir(dir, 0o755); err != nil {
		return fmt.Errorf("DAN %w", err)
	}
	path := Path(dir, sandboxID)
	lock, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("DAN dir %s: %w", dir, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("DAN dir %s: lock: %w", dir, err)
	}

	// A writer killed between write and rename leaves this behind.
	if err := os.Remove(path + ".tmp"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("DAN file %s: %w", path, err)
	}

	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("DAN file %s: %w", path, err)
	}
	f, err := parseRawFile(b)
	if err != nil {
		return fmt.Errorf("DAN file %s: %w", path, err)
	}
	change(f)

	if len(f.devices) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("DAN file %s: %w", path, err)
		}
		return nil
	}
	if err := safefile.WriteAtomic(path, f.encode(), 0o644); err != nil {
		return fmt.Errorf("DAN file %s: %w", path, err)
	}
	return nil
}
