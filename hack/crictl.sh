#!/usr/bin/env bash
# Runs crictl, building it first from the Go module proxy into the
# gitignored .cache/bin if it is missing or of another version. Its module
# graph stays out of napitap's go.mod. `hack/crictl.sh --path` builds it if
# needed and prints where it is (test/e2e/cri does this).
#   hack/crictl.sh -r unix:///tmp/napicri-XXX/containerd.sock pods
set -euo pipefail
version=v1.37.0
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/.cache/bin/crictl
if ! [ -x "$bin" ] || ! go version -m "$bin" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+sigs.k8s.io/cri-tools[[:space:]]+$version([[:space:]]|$)"; then
	command -v go >/dev/null || { echo "Go 1.26+ must be on PATH (e.g. /usr/local/go/bin)" >&2; exit 1; }
	echo "crictl: building sigs.k8s.io/cri-tools/cmd/crictl@$version into $root/.cache/bin" >&2
	GOBIN=$root/.cache/bin GOFLAGS=-buildvcs=false go install "sigs.k8s.io/cri-tools/cmd/crictl@$version"
fi
if [ "${1:-}" = --path ]; then
	echo "$bin"
	exit 0
fi
exec "$bin" "$@"
