#!/bin/bash
# /init of the guest that make test-kernel boots (kernel_test.go packs it
# with the test binaries, in the cpio it appends to rootfs.sh's).
# Runs each test binary that /tests/list names, in list order, as root with
# CI=true, and reports on the serial console, each marker on a line of its
# own (kernel_test.go parses them):
#   NAPITAP-KERNEL-UNAME <uname -r>
#   NAPITAP-KERNEL-PKG-START <package>
#   NAPITAP-KERNEL-PKG-END <package> rc=<exit status> secs=<wall seconds>
#   NAPITAP-KERNEL-ERROR <what the guest could not set up>
#   NAPITAP-KERNEL-DONE
# then powers off. /tests/list, from the host's second cpio: one line per
# package, "<package><TAB><binary under /tests/bin><TAB><go test flags>".
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
# Binaries some tests would go build (internal/cnitest.PrebuiltEnv).
export NAPITAP_PREBUILT_BIN=/tests/prebuilt
# TCG runs code 10 to 50 times slower: the limits of tests that time
# napitap (internal/nstest.TimeScale).
export NAPITAP_TEST_TIME_SCALE=20
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
exec </dev/console >/dev/console 2>&1

off() {
	echo "NAPITAP-KERNEL-DONE"
	sync
	echo o >/proc/sysrq-trigger
	sleep 30
}
fail() {
	echo "NAPITAP-KERNEL-ERROR $*"
	off
}

hostname napitap-kernel
printf '127.0.0.1 localhost\n::1 localhost\n' >/etc/hosts
ip link set lo up || fail "lo up"
for m in tun veth bridge dummy; do
	modprobe "$m" || fail "modprobe $m"
done
[ -c /dev/net/tun ] || fail "no /dev/net/tun after modprobe tun"
mkdir -p /run/netns

echo "NAPITAP-KERNEL-UNAME $(uname -r)"
echo "guest: $(nproc) CPUs, $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo), seccomp actions: $(cat /proc/sys/kernel/seccomp/actions_avail)"
[ -s /tests/list ] || fail "no /tests/list"

while IFS=$'\t' read -r pkg bin flags; do
	[ -n "$pkg" ] || continue
	dir=/src/$pkg # what go test's working directory would be
	mkdir -p "$dir"
	echo "NAPITAP-KERNEL-PKG-START $pkg"
	start=$(date +%s%N)
	# shellcheck disable=SC2086 # flags are words
	(cd "$dir" && exec env CI=true /tests/bin/"$bin" $flags) </dev/null
	rc=$?
	end=$(date +%s%N)
	echo
	echo "NAPITAP-KERNEL-PKG-END $pkg rc=$rc secs=$(((end - start) / 1000000000))"
	# What a test left behind would confuse the next package's.
	for n in $(ip netns list 2>/dev/null | awk '{print $1}'); do ip netns del "$n"; done
done </tests/list
off
