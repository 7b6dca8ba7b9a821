package takeover

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/handoff"
)

// seqpacketPair is a connected pair of the takeover socket's type.
func seqpacketPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "takeover-pair")
		c, err := net.FileConn(f) // a dup
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	return conns[0], conns[1]
}

func TestOneItemWithALongOriginNeverFailsATakeover(t *testing.T) {
	long := strings.Repeat("<", 11000) // 66,000 bytes of JSON
	tests := []struct {
		name    string
		origins []string // one listener each, between queues and a socket
	}{
		{"an origin of 11,000 '<' among short ones is cut and every file arrives", []string{"pod a/b", long, "pod c/d"}},
		{"an origin of 11,000 '<' first of all is cut and every file arrives", []string{long, "pod a/b"}},
		{"an origin of 11,000 '<' last of all is cut and every file arrives", []string{"pod a/b", long}},
		{"two origins of 11,000 '<' in a row are each cut", []string{long, long}},
		{"an origin of 11,000 U+2028 is cut on a rune boundary", []string{strings.Repeat("\u2028", 11000)}},
		{"an item over the batch budget but under MaxHeader goes alone, whole", []string{"pod a/b", strings.Repeat("x", batchHeader), "pod c/d"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var files []File
			add := func(it Item) {
				f, err := os.Create(filepath.Join(t.TempDir(), "f"))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				files = append(files, File{Item: it, File: f})
			}
			add(Item{Kind: KindSocket, Name: "seccomp"})
			for i, o := range tc.origins {
				add(Item{Kind: KindQueue, Key: &handoff.Key{ContainerID: "c0ffee", IfName: "net1"}})
				add(Item{Kind: KindListener, UID: uint32(4242 + i), Origin: o, ID: "l" + string(rune('a'+i))})
			}
			add(Item{Kind: KindQueue, Key: &handoff.Key{ContainerID: "c0ffee", IfName: "net2"}})
			old, new := seqpacketPair(t)
			sent := make(chan error, 1)
			go func() {
				err := sendFiles(old, files)
				if err != nil {
					old.Close() // as the old napitapd does: recvFiles sees EOF
				}
				sent <- err
			}()
			got, err := recvFiles(new)
			if err := errors.Join(<-sent, err); err != nil {
				t.Fatalf("takeover failed: %v", err)
			}
			defer CloseAll(got)
			if len(got) != len(files) {
				t.Fatalf("%d files arrived, want %d", len(got), len(files))
			}
			for i, f := range got {
				want := files[i].Item
				if !sameFile(f.File, files[i].File) {
					t.Errorf("file %d is another file", i)
				}
				o := f.Item.Origin
				f.Item.Origin, want.Origin = "", ""
				if f.Item.Kind != want.Kind || f.Item.Name != want.Name || f.Item.UID != want.UID || f.Item.ID != want.ID ||
					(f.Item.Key == nil) != (want.Key == nil) || (want.Key != nil && *f.Item.Key != *want.Key) {
					t.Errorf("file %d: %+v, want %+v", i, f.Item, want)
				}
				whole, err := json.Marshal(files[i].Item)
				if err != nil {
					t.Fatal(err)
				}
				switch orig := files[i].Item.Origin; {
				case !strings.HasPrefix(orig, o) || !utf8.ValidString(o):
					t.Errorf("file %d: origin %.40q..., want a valid prefix of %.40q...", i, o, orig)
				case len(whole) <= maxItem && o != orig:
					t.Errorf("file %d: origin of %d bytes cut to %d", i, len(orig), len(o))
				case len(whole) > maxItem && len(o) > cutOrigin:
					t.Errorf("file %d: origin of %d bytes, want it cut to at most %d", i, len(o), cutOrigin)
				}
			}
		})
	}
}

func TestALongReasonStillReachesThePeer(t *testing.T) {
	tests := []struct {
		name string
		m    *message
	}{
		{"an abort whose reason is 11,000 '<' arrives, cut", &message{Op: opAbort, Error: strings.Repeat("<", 11000)}},
		{"a refusal whose reason is 11,000 '<' arrives, cut", &message{Op: opRefuse, Error: strings.Repeat("<", 11000)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := seqpacketPair(t)
			if err := send(a, tc.m, nil); err != nil {
				t.Fatalf("send: %v", err)
			}
			var perr *PeerError
			if _, _, err := recv(b, opReady); !errors.As(err, &perr) || perr.Op != tc.m.Op || len(perr.Message) > maxError {
				t.Fatalf("recv: %v, want the peer's %s with a reason of at most %d bytes", err, tc.m.Op, maxError)
			}
		})
	}
}
