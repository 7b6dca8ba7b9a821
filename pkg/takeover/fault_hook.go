//go:build napitap_faults

package takeover

import (
	"errors"
	"net"
	"os"
	"path/filepath"
)

// FaultFile, in the state dir, makes a napitapd built with the tag
// napitap_faults hang up on every takeover request while it exists: the
// node e2e's rollout that cannot complete. A shipped build has no such
// hook (fault.go).
const FaultFile = "refuse-takeover"

func fault(l *net.UnixListener) error {
	path := filepath.Join(filepath.Dir(l.Addr().String()), FaultFile)
	if _, err := os.Lstat(path); err == nil {
		return errors.New(path + " exists")
	}
	return nil
}
