//go:build napitap_faults

package takeover

import (
	"errors"
	"net"
	"os"
	"path/filepath"
)

// fault: FaultFile exists beside the takeover socket.
func fault(l *net.UnixListener) error {
	path := filepath.Join(filepath.Dir(l.Addr().String()), FaultFile)
	if _, err := os.Lstat(path); err == nil {
		return errors.New(path + " exists")
	}
	return nil
}
