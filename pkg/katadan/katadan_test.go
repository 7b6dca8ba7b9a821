package katadan_test

import (
	"encoding/json"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/napitap/napitap/pkg/katadan"
)

func device(name, network string) katadan.Device {
	return katadan.Device{
		Name:     name,
		GuestMAC: "02:00:00:00:00:01",
		Device:   katadan.HostTap{Type: "host-tap", TapName: "tap" + name, QueueNum: 2, QueueSize: 256},
		NetworkInfo: katadan.NetworkInfo{
			Interface: katadan.Interface{IPAddresses: []string{"10.0.0.2/24"}, MTU: 1500, NType: "tuntap"},
			Routes:    []katadan.Route{{Dest: "0.0.0.0/0", Gateway: "10.0.0.1"}},
		},
		Network: network,
	}
}

func read(t *testing.T, dir, sandbox string) *katadan.File {
	t.Helper()
	b, err := os.ReadFile(katadan.Path(dir, sandbox))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var f katadan.File
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("DAN file is not JSON: %v", err)
	}
	return &f
}

func TestPutAndRemove(t *testing.T) {
	cases := []struct {
		name    string
		steps   func(dir string) error
		devices []string // nil: no file
	}{
		{"one device makes a file with the sandbox netns", func(dir string) error {
			return katadan.Put(dir, "sb1", "/run/netns/x", device("net1", "a"))
		}, []string{"net1"}},
		{"a second device of the sandbox joins the first", func(dir string) error {
			if err := katadan.Put(dir, "sb1", "/run/netns/x", device("net1", "a")); err != nil {
				return err
			}
			return katadan.Put(dir, "sb1", "/run/netns/x", device("net2", "a"))
		}, []string{"net1", "net2"}},
		{"putting a device again replaces it", func(dir string) error {
			if err := katadan.Put(dir, "sb1", "/run/netns/x", device("net1", "a")); err != nil {
				return err
			}
			return katadan.Put(dir, "sb1", "/run/netns/x", device("net1", "a"))
		}, []string{"net1"}},
		{"removing the last device removes the file", func(dir string) error {
			if err := katadan.Put(dir, "sb1", "/run/netns/x", device("net1", "a")); err != nil {
				return err
			}
			return katadan.Remove(dir, "sb1", "net1")
		}, nil},
		{"removing from a missing file is fine", func(dir string) error {
			return katadan.Remove(dir, "sb1", "net1")
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.steps(dir); err != nil {
				t.Fatal(err)
			}
			f := read(t, dir, "sb1")
			if tc.devices == nil {
				if f != nil {
					t.Fatalf("file left: %+v", f)
				}
				if entries, _ := os.ReadDir(dir); len(entries) != 0 {
					t.Errorf("files left in the DAN dir: %v", entries)
				}
				return
			}
			if f == nil || f.Netns != "/run/netns/x" || len(f.Devices) != len(tc.devices) {
				t.Fatalf("got %+v, want devices %v", f, tc.devices)
			}
			for i, name := range tc.devices {
				if f.Devices[i].Name != name || f.Devices[i].Device.Type != "host-tap" {
					t.Errorf("device %d: %+v, want host-tap %s", i, f.Devices[i], name)
				}
			}
		})
	}
}

func TestConcurrentPutsLoseNothing(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := katadan.Put(dir, "sb1", "/run/netns/x", device("net"+string(rune('a'+i)), "a")); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if f := read(t, dir, "sb1"); f == nil || len(f.Devices) != 16 {
		t.Errorf("got %+v, want 16 devices", f)
	}
}

func TestStaleListsOnlyThisNetworksUnwantedDevices(t *testing.T) {
	dir := t.TempDir()
	for _, step := range []struct{ sandbox, name, network string }{
		{"valid", "net1", "a"}, {"valid", "net4", "a"}, {"stale", "net1", "a"}, {"stale", "net2", "b"},
	} {
		if err := katadan.Put(dir, step.sandbox, "/run/netns/x", device(step.name, step.network)); err != nil {
			t.Fatal(err)
		}
	}
	stale, err := katadan.Stale(dir, "a", func(sandbox, name string) bool { return sandbox == "valid" && name == "net1" })
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range stale {
		got = append(got, e.Sandbox+"/"+e.Name)
	}
	slices.Sort(got)
	if want := []string{"stale/net1", "valid/net4"}; !slices.Equal(got, want) {
		t.Errorf("stale %v, want %v", got, want)
	}
}

func TestALeftoverTempFileIsCleanedUp(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(katadan.Path(dir, "sb1")+".tmp", []byte("{half"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := katadan.Remove(dir, "sb1", "net1"); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("DAN dir: %v, want empty", entries)
	}
}
