package tapsetup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ProbeDevDir is the sysfs directory whose files tell which per-device NAPI
// knobs the kernel has: sysfs gives every net device the same attributes,
// and lo is in every netns. Probing only stats it; a version string would
// lie on backporting kernels.
const ProbeDevDir = "/sys/class/net/lo"

// KernelNeed is one thing a config asks of the kernel: a TUNGETFEATURES bit
// or a device attribute under /sys/class/net/<dev>, and the config field
// that asks for it.
type KernelNeed struct {
	Field   string // the config field, e.g. "threadedNapi"
	Feature uint32 // a TUNGETFEATURES bit, or 0
	Attr    string // a /sys/class/net/<dev> attribute, or ""
	What    string // what it is and since when, e.g. "threaded NAPI (Linux 5.12+)"
	Fix     string // what the operator can change instead, or ""
}

// UnmetNeedError names the first need the kernel cannot serve.
type UnmetNeedError struct {
	Need   KernelNeed
	Detail string
}

func (e *UnmetNeedError) Error() string {
	msg := fmt.Sprintf("%s: the kernel has no %s: %s", e.Need.Field, e.Need.What, e.Detail)
	if e.Need.Fix != "" {
		msg += "; " + e.Need.Fix
	}
	return msg
}

// RequireKernel fails with an *UnmetNeedError when the kernel, as features
// (TUNGETFEATURES) and devDir (a /sys/class/net/<dev> directory) show it,
// cannot serve every need. It only reads: writing a knob to see whether it
// exists could switch threaded NAPI (DESIGN.md fact 9). Without devDir at
// all (no sysfs mounted) the attributes cannot be told and are not checked;
// ADD's write reports them then.
func RequireKernel(needs []KernelNeed, features uint32, devDir string) error {
	_, dirErr := os.Stat(devDir)
	for _, n := range needs {
		if n.Feature != 0 && features&n.Feature == 0 {
			return &UnmetNeedError{Need: n, Detail: fmt.Sprintf("TUNGETFEATURES of %s is 0x%x", tunDevice, features)}
		}
		if n.Attr == "" || dirErr != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(devDir, n.Attr)); errors.Is(err, fs.ErrNotExist) {
			return &UnmetNeedError{Need: n, Detail: fmt.Sprintf("%s has no %s", devDir, n.Attr)}
		}
	}
	return nil
}
