package katadan_test

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
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

// TestWhatNapitapDoesNotOwnStaysByteForByte: other writers share a
// sandbox's DAN file. Their devices (a vhost-user one needs its "path")
// and fields napitap does not know go back as they were read, through a
// Put and a Remove of napitap's own device.
func TestWhatNapitapDoesNotOwnStaysByteForByte(t *testing.T) {
	dir := t.TempDir()
	const (
		theirDevice = `{"name": "eth9", "device": {"type": "vhost-user", "path": "/run/vhost/sock<1>", "queue_num": 4, "later_field": [1, 2.50, "x"]}, "network_info": {}}`
		theirField  = `{"a":  "b <&>"}`
	)
	written := "{\n  \"netns\": \"/var/run/netns/sandbox\",\n  \"x_future\": " + theirField + ",\n  \"devices\": [" + theirDevice + "]\n}\n"
	if err := os.WriteFile(katadan.Path(dir, "sb"), []byte(written), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(after string, wantOurs bool) {
		t.Helper()
		b, err := os.ReadFile(katadan.Path(dir, "sb"))
		if err != nil {
			t.Fatalf("after %s: %v", after, err)
		}
		for _, want := range []string{theirDevice, theirField} {
			if !strings.Contains(string(b), want) {
				t.Errorf("after %s, the file lacks %s byte for byte:\n%s", after, want, b)
			}
		}
		f := read(t, dir, "sb")
		var names []string
		for _, d := range f.Devices {
			names = append(names, d.Name)
		}
		if want := map[bool][]string{true: {"eth9", "net1"}, false: {"eth9"}}[wantOurs]; !slices.Equal(names, want) {
			t.Errorf("after %s, devices %q, want %q", after, names, want)
		}
	}
	if err := katadan.Put(dir, "sb", "/var/run/netns/sandbox", device("net1", "kata")); err != nil {
		t.Fatal(err)
	}
	check("Put", true)
	if err := katadan.Remove(dir, "sb", "net1"); err != nil {
		t.Fatal(err)
	}
	check("Remove", false)
	stale, err := katadan.Stale(dir, "kata", func(string, string) bool { return false })
	if err != nil || len(stale) != 0 {
		t.Errorf("Stale: %+v, %v; another writer's device is never napitap's", stale, err)
	}
}
