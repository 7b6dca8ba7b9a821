#!/usr/bin/env bash
# Compares a Go benchmark of the work tree with the same benchmark of an
# earlier commit, with benchstat: both test binaries are built first and
# then run by turns, COUNT times each, so that whatever else the machine
# does falls on both alike. Run it as root for the privileged benchmarks.
#
#   hack/bench-against.sh REV PKG BENCH [COUNT [test binary flags...]]
#   hack/bench-against.sh cf83289 ./cmd/napitapd Takeover 6 -test.benchtime=20x
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
rev=$1 pkg=$2 bench=$3 count=${4:-6}
shift $(($# < 4 ? $# : 4))
root=$(cd "$(dirname "$0")/.." && pwd)
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
benchstat=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

tmp=$(mktemp -d /tmp/napitap-bench-against.XXXXXX)
trap 'git -C "$root" worktree remove --force "$tmp/old" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
git -C "$root" worktree add --detach "$tmp/old" "$rev" >/dev/null 2>&1
(cd "$tmp/old" && go test -c -o "$tmp/old.test" "$pkg")
(cd "$root" && go test -c -o "$tmp/new.test" "$pkg")
for i in $(seq "$count"); do
	for which in old new; do
		dir=$root; [ $which = old ] && dir=$tmp/old
		echo "run $i, $which" >&2
		# A test binary runs in its package's dir, as go test runs it.
		(cd "$dir/$pkg" && "$tmp/$which.test" -test.run '^$' -test.bench "$bench" "$@") | grep -E '^(Benchmark|goos|goarch|pkg|cpu)' >> "$tmp/$which.txt"
	done
done
go run "$benchstat" "$rev=$tmp/old.txt" "work tree=$tmp/new.txt"
