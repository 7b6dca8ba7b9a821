#!/usr/bin/env bash
# Builds the real-node e2e's Multus thin plugin
# (gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus v4.2.2) from the
# Go module proxy through the nested wrapper module multusbuild (whose
# dependencies never enter napitap's go.mod; `go install` cannot fetch it,
# docs/DESIGN.md fact 16) into the gitignored .cache/multus-<version>/, as
# build.sh does for Kubernetes: only when the binary is missing or the
# wrapper module or Go changed since (a stamp file records both). `--path`
# prints the directory on stdout (the test calls that).
set -euo pipefail
version=v4.2.2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mod=$here/multusbuild
out=$root/.cache/multus-$version
pkg=gopkg.in/k8snetworkplumbingwg/multus-cni.v4

command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "Go 1.26+ must be on PATH (e.g. /usr/local/go/bin)" >&2; exit 1; }

stamp=$( { cat "$mod/go.mod" "$mod/go.sum" "$0"; go version; } | sha256sum | cut -d' ' -f1)
if [ ! -x "$out/multus" ] || [ "$(cat "$out/stamp" 2>/dev/null)" != "$stamp" ]; then
	echo "multus.sh: building Multus $version into $out" >&2
	mkdir -p "$root/.cache"
	tmp=$(mktemp -d "$root/.cache/multus-build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	start=$(date +%s)
	# -mod=readonly keeps go.sum as committed; the version is what
	# `multus -version` and its log say.
	(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
		-ldflags "-s -w -X $pkg/pkg/multus.version=$version" -o "$tmp/multus" "$pkg/cmd/multus")
	mkdir -p "$out"
	mv -f "$tmp/multus" "$out/multus"
	rm -f "$out/stamp" # a new file, never one hard-linked from another checkout's cache
	echo "$stamp" > "$out/stamp"
	echo "multus.sh: built in $(( $(date +%s) - start )) s" >&2
fi
if [ "${1:-}" = --path ]; then
	echo "$out"
fi
