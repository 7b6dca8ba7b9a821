package vm

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAppendToInitrd: the first archive as it was, the second on a 4-byte
// boundary, gzip'd newc with each file after the directories it needs.
func TestAppendToInitrd(t *testing.T) {
	first := []byte("an initramfs of 23 bytes") // not a multiple of 4
	p := filepath.Join(t.TempDir(), "initrd.gz")
	if err := os.WriteFile(p, first, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := AppendToInitrd(p, []InitrdFile{
		{Name: "kubevirt/init", Mode: 0o755, Data: []byte("#!/bin/sh\n")},
		{Name: "kubevirt/script", Mode: 0o644, Data: []byte("echo hi\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, first) {
		t.Fatal("the first archive changed")
	}
	rest := got[len(first):]
	pad := (4 - len(first)%4) % 4
	if !bytes.Equal(rest[:pad], make([]byte, pad)) {
		t.Fatalf("no zero padding to a 4-byte boundary: % x", rest[:pad])
	}
	zr, err := gzip.NewReader(bytes.NewReader(rest[pad:]))
	if err != nil {
		t.Fatal(err)
	}
	cpio, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	s := string(cpio)
	if !strings.HasPrefix(s, "070701") {
		t.Fatalf("not a newc archive: %q", s[:min(len(s), 16)])
	}
	last := -1
	for _, name := range []string{"kubevirt\x00", "kubevirt/init\x00", "#!/bin/sh\n", "kubevirt/script\x00", "echo hi\n", "TRAILER!!!\x00"} {
		i := strings.Index(s, name)
		if i <= last {
			t.Fatalf("%q at %d, after %d: want it in order", name, i, last)
		}
		last = i
	}
}
