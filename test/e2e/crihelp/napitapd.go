package crihelp

import (
	"fmt"
	"os"
	"path/filepath"
)

// ReadLog is napitapd's log so far.
func (d *Napitapd) ReadLog() string {
	b, _ := os.ReadFile(d.LogPath)
	return string(b)
}

// Fds lists what napitapd's open fds point at ("anon_inode:seccomp
// notify", "socket:[...]", ...): the agent's listeners are visible there.
func (d *Napitapd) Fds() ([]string, error) {
	dir := fmt.Sprintf("/proc/%d/fd", d.Pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			out = append(out, target)
		}
	}
	return out, nil
}
