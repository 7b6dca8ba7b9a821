#!/usr/bin/env bash
# Measures napitap's ADD and DEL against an earlier commit's napitap with
# `napitap-bench cni --against`: both builds' napitap exec'd by turns in
# every iteration, beside the reference tap plugin, so that whatever else
# the machine does falls on both alike. Builds run under nice 10, the
# bench at the shell's own priority. Run it as root.
#
#   hack/cni-against.sh REV [napitap-bench cni flags...]
#   hack/cni-against.sh HEAD~ --variants b4,d --iterations 200
#   THIS=abc1234 hack/cni-against.sh abc1234~   (a commit against its parent)
#
# "This build" is the work tree's napitap, or with THIS=REV that commit's;
# the bench, napitapd and the other plugins are always the work tree's.
#
# The report (cni.md, with its section "This build against --against's
# napitap") goes to $OUT, default a temp dir, and to stdout.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
rev=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
tmp=$(mktemp -d /tmp/napitap-cni-against.XXXXXX)
trap 'for w in old-src this-src; do git -C "$root" worktree remove --force "$tmp/$w" >/dev/null 2>&1; done; rm -rf "$tmp/old-src" "$tmp/this-src" "$tmp/new" "$tmp/old" "$tmp/bench"' EXIT
out=${OUT:-$tmp/out}

export CGO_ENABLED=0 GOWORK=off
build=(nice -n 10 go build -trimpath "-ldflags=-s -w")
plugins=github.com/containernetworking/plugins
(cd "$root" && "${build[@]}" -o "$tmp/new/" ./plugins/napitap ./cmd/napitapd ./internal/bench/cnibench/launch/napitap-bench-launcher \
	"$plugins/plugins/main/bridge" "$plugins/plugins/ipam/host-local" && "${build[@]}" -o "$tmp/bench" ./cmd/napitap-bench)
version=$(cd "$root" && go list -m -f '{{.Version}}' "$plugins")
(cd "$tmp/new" && GOBIN=$tmp/new nice -n 10 go install -trimpath "-ldflags=-s -w" "$plugins/plugins/main/tap@$version")
git -C "$root" worktree add --detach "$tmp/old-src" "$rev" >/dev/null 2>&1
(cd "$tmp/old-src" && "${build[@]}" -o "$tmp/old/" ./plugins/napitap)
this="$(git -C "$root" describe --always --dirty) (work tree)"
if [ -n "${THIS:-}" ]; then
	git -C "$root" worktree add --detach "$tmp/this-src" "$THIS" >/dev/null 2>&1
	(cd "$tmp/this-src" && "${build[@]}" -o "$tmp/new/" ./plugins/napitap)
	this=$(git -C "$root" rev-parse --short "$THIS")
fi

echo "this build: napitap at $this, against: napitap at $(git -C "$root" rev-parse --short "$rev")" >&2
cd "$root"
"$tmp/bench" cni --bin "$tmp/new" --against "$tmp/old/napitap" --bursts '' --variants b4,d --out "$out" "$@"
echo "report: $out/cni.md" >&2
