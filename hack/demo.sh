#!/usr/bin/env bash
# The demo: a throwaway "node" netns and "pod" netns and a napitapd of the
# demo's own; cnitool runs the bridge + napitap chain as a runtime would,
# shows the result, the tap, its tc filters and the queues napitapd holds,
# checks it, deletes it, and shows nothing is left.
set -euo pipefail
cd "$(dirname "$0")/.."

host=napitap-demo-host
pod=napitap-demo-pod
work=$(mktemp -d /tmp/napitap-demo.XXXXXX)
napitapd_pid=
cleanup() {
	if [ -n "$napitapd_pid" ]; then kill "$napitapd_pid" 2>/dev/null; wait "$napitapd_pid" 2>/dev/null || true; fi
	ip netns del "$pod" 2>/dev/null || true
	ip netns del "$host" 2>/dev/null || true
	rm -rf "$work" /run/napitap-demo
}
trap cleanup EXIT
cleanup_stale() { ip netns del "$pod" 2>/dev/null || true; ip netns del "$host" 2>/dev/null || true; }
cleanup_stale

ip netns add "$host"
ip netns add "$pod"
socket=$work/napitapd.sock
sed "s#/run/napitap/napitapd.sock#$socket#" examples/bridge-napitap.conflist >"$work/bridge-napitap.conflist"
./bin/napitapd --socket "$socket" --seccomp-socket "$work/seccomp.sock" --state-dir "$work/state" 2>"$work/napitapd.log" &
napitapd_pid=$!
for _ in $(seq 50); do [ -S "$socket" ] && break; sleep 0.1; done

export CNI_PATH=$PWD/bin NETCONFPATH=$work CNI_IFNAME=eth0
# Plugins run in the throwaway host netns, so the bridge is made there.
cnitool() { ip netns exec "$host" ./bin/cnitool "$@"; }
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "ADD: bridge + napitap, 4 NAPI queues, tc-redirect wiring"
cnitool add napitap-demo "/run/netns/$pod"

say "the tap in the pod netns (ip -d link show tap0)"
ip -n "$pod" -d link show tap0
say "its NAPI knobs"
ip netns exec "$pod" sh -c 'cd /sys/class/net/tap0 && for f in tun_flags gro_flush_timeout threaded; do echo "$f: $(cat $f)"; done'
say "tc redirect filters (eth0 <-> tap0)"
ip netns exec "$pod" tc filter show dev eth0 ingress
ip netns exec "$pod" tc filter show dev tap0 ingress

say "napitapd holds the NAPI queues until the VMM fetches them (napitapctl list)"
./bin/napitapctl --socket "$socket" list

say "CHECK"
cnitool check napitap-demo "/run/netns/$pod" && echo "CHECK passed"

say "DEL"
cnitool del napitap-demo "/run/netns/$pod"
say "the pod netns after DEL"
ip -n "$pod" link show
left=$(ip -n "$pod" -o link show | grep -vc ': lo:' || true)
if [ "$left" != 0 ]; then
	echo "FAIL: $left links left in the pod netns" >&2
	exit 1
fi
echo "nothing left: only lo remains"
say "napitapd after DEL"
./bin/napitapctl --socket "$socket" list
