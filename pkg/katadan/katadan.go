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
	Network     string      `json:"napitap_network,omitempty"`
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
// it has no devices left. A missing file or device is fine.
func Remove(dir, sandboxID, name string) error {
	return update(dir, sandboxID, func(f *File) {
		f.Devices = without(f.Devices, func(d Device) bool { return d.Name == name })
	})
}

// GC drops napitap's devices of network from every sandbox not in keep.
func GC(dir, network string, keep func(sandboxID string) bool) error {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range paths {
		sandbox := filepath.Base(p[:len(p)-len(".json")])
		if keep(sandbox) {
			continue
		}
		errs = append(errs, update(dir, sandbox, func(f *File) {
			f.Devices = without(f.Devices, func(d Device) bool { return d.Network == network })
		}))
	}
	return errors.Join(errs...)
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
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("DAN dir %s: %w", dir, err)
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
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("DAN file %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("DAN file %s: %w", path, err)
	}
	return nil
}
