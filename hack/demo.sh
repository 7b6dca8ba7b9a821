#!/usr/bin/env bash
# The demo: a throwaway "node" netns and "pod" netns and a napitapd of the
# demo's own; cnitool runs the bridge + napitap chain as a runtime would,
# shows the result, the tap, its tc filters and the queues napitapd holds,
# fetches the queues as a VMM would and proves NAPI on one with a GRO probe,
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
# Escape codes only for a terminal: CI logs and pipes get plain text.
bold= plain=
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; fi
say() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }
note() { printf -- '-- %s\n' "$@"; }
napitapctl() { ./bin/napitapctl --socket "$socket" "$@"; }

# tun_flags decoded, e.g. 0x5912: IFF_TAP IFF_NO_PI ... IFF_NAPI.
tun_flags() {
	local v=$(($1)) out= bit name
	for bit in 0x1:IFF_TUN 0x2:IFF_TAP 0x1000:IFF_NO_PI 0x4000:IFF_VNET_HDR 0x100:IFF_MULTI_QUEUE \
		0x800:IFF_PERSIST 0x10:IFF_NAPI 0x20:IFF_NAPI_FRAGS 0x2000:IFF_ONE_QUEUE 0x8000:IFF_TUN_EXCL; do
		name=${bit#*:} bit=${bit%%:*}
		if ((v & bit)); then out+=" $name"; v=$((v & ~bit)); fi
	done
	((v == 0)) || out+=" $(printf '%#x' "$v")"
	echo "${out# }"
}

say "ADD: bridge + napitap, 4 NAPI queues, tc-redirect wiring"
cnitool add napitap-demo "/run/netns/$pod"
echo # cnitool ends its JSON without a newline
note "two \"eth0\": the first, in $pod, is the pod's veth (bridge made it, napitap wired it to tap0);" \
	"the last, whose sandbox is the container ID, is the guest's NIC: its MAC and the \"ips\" are what the guest must use."

say "the tap in the pod netns (ip -d link show tap0)"
ip -n "$pod" -d link show tap0
note "tun type tap multi_queue: one device whose 4 queues are 4 fds; alias: napitap's mark of this attachment" \
	"(DEL and GC delete only a tap that carries it); qdisc noqueue: rootQdisc's default, which spares the kernel" \
	"mq's 256 queues, 6 MiB of slab per tap (docs/DESIGN.md fact 15)."
say "its NAPI knobs"
sysfs=/sys/class/net/tap0
flags=$(ip netns exec "$pod" cat $sysfs/tun_flags)
printf 'tun_flags: %s = %s\n' "$flags" "$(tun_flags "$flags")"
ip netns exec "$pod" sh -c "cd $sysfs && for f in gro_flush_timeout threaded; do echo \"\$f: \$(cat \$f)\"; done"
if (($(tun_flags "$flags" | grep -c -w IFF_NAPI))); then napi=on; else napi=off; fi
note "IFF_NAPI $napi; these are the device's flags, the first attacher's (docs/DESIGN.md fact 2): whether a queue has NAPI only a probe shows (below)." \
	"gro_flush_timeout (ns) lets GRO hold packets to merge them; threaded 1: NAPI polls in napi/tap0-N kernel threads."
say "tc redirect filters (eth0 <-> tap0)"
ip netns exec "$pod" tc filter show dev eth0 ingress
ip netns exec "$pod" tc filter show dev tap0 ingress
note "eth0's ingress redirects every frame to tap0 (towards the guest), tap0's ingress every frame to eth0" \
	"(from the guest): the guest uses eth0's MAC and addresses, and the pod's own stack sees no traffic."

say "napitapd holds the NAPI queues until the VMM fetches them (napitapctl list)"
napitapctl list
note "MAC: the guest's (as in the ADD result), not the tap's; HELD: the queue fds napitapd holds now."

say "fetch: the step that gives a guest NAPI (napitapctl exec -- napitapctl probe {fds})"
note "A VMM in the pod runs under napitapctl exec, which fetches the queues and passes them as fds 3..6;" \
	"here the VMM is a probe that writes 16 TCP segments into fd 3, as a guest would, and counts what leaves the tap."
note "GRO merges the probe's segments only if it may hold them (docs/DESIGN.md fact 10): the demo sets gro_flush_timeout for the probe;" \
	"the example leaves it at the kernel's 0, as docs/bench/datapath.md chose (20000 ns made one TCP stream 0.33x a plain queue)."
ip netns exec "$pod" sh -c "echo 200000 >$sysfs/gro_flush_timeout"
if ! ip netns exec "$pod" ./bin/napitapctl --socket "$socket" exec -- ./bin/napitapctl probe {fds}; then
	echo "FAIL: the probe on the fetched queue did not show NAPI merging (see above)" >&2
	exit 1
fi
say "napitapd after the fetch"
napitapctl list
note "HELD 0: the VMM got the fds and napitapd kept none; the probe has exited, closing them." \
	"The tap stays; the next fetch (a restarted VMM) reopens its NAPI queues in the pod netns."

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
napitapctl list
