// Package katadan writes the "directly attachable network" (DAN) files that
// Kata Containers' runtime-rs reads to plug host taps into a sandbox VM:
// /run/kata-containers/dans/<sandbox id>.json, one file per sandbox with a
// list of devices. Several napitap attachments of one sandbox share the
// file, so every change is a locked read-modify-write.
package katadan

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
	return update(dir, sandboxID, func(f *File) {
		f.Netns = netns
		f.Devices = append(without(f.Devices, func(d Device) bool { return d.Name == dev.Name }), dev)
	})
}

// Remove drops the device name from the sandbox's file, and the file when
// it has no devices left. A missing dir, file or device is fine.
func Remove(dir, sandboxID, name string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return update(dir, sandboxID, func(f *File) {
		f.Devices = without(f.Devices, func(d Device) bool { return d.Name == name })
	})
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
		var f File
		if err := json.Unmarshal(b, &f); err != nil {
			continue // not ours to judge
		}
		sandbox := filepath.Base(p[:len(p)-len(".json")])
		for _, d := range f.Devices {
			if d.Network == network && !keep(sandbox, d.Name) {
				stale = append(stale, Entry{Sandbox: sandbox, Netns: f.Netns, Device: d})
			}
		}
	}
	return stale, nil
}

func without(devs []Device, drop func(Device) bool) []Device {
	var kept []Device
	for _, d := range devs {
		if !drop(d) {
			kept = append(kept, d)
		}
	}
	return kept
}

// update applies change to the sandbox's file under an exclusive lock on
// the directory itself (no lock file to leave behind), writing through a
// temp file and rename so runtime-rs never reads half a file.
func update(dir, sandboxID string, change func(*File)) error {
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

	var f File
	switch b, err := os.ReadFile(path); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("DAN file %s: %w", path, err)
	default:
		if err := json.Unmarshal(b, &f); err != nil {
			return fmt.Errorf("DAN file %s: %w", path, err)
		}
	}
	change(&f)

	if len(f.Devices) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("DAN file %s: %w", path, err)
		}
		return nil
	}
	b, err := json.MarshalIndent(&f, "", "  ")
	if err != nil {
		return err
	}
	if err := safefile.WriteAtomic(path, b, 0o644); err != nil {
		return fmt.Errorf("DAN file %s: %w", path, err)
	}
	return nil
}
