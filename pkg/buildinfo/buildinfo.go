// Package buildinfo is the one version every napitap binary reports.
package buildinfo

import "runtime/debug"

// version is set at link time by make build and deploy/Dockerfile:
// -X github.com/napitap/napitap/pkg/buildinfo.version=v0.3.0.
var version = ""

// Version is the linked-in version; without one, the commit `go build`
// stamped from the git checkout ("dev-<12 hex>", "-dirty" if modified),
// or "dev".
func Version() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision" && len(s.Value) >= 12:
			rev = s.Value[:12]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return "dev"
	}
	return "dev-" + rev + dirty
}

// String is what a binary's --version prints: "napitapd v0.3.0".
func String(program string) string { return program + " " + Version() }
