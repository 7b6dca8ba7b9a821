#!/usr/bin/env bash
# Builds, once, the guest that make test-kernel boots: Debian 12's kernel
# (linux-image-cloud-amd64 from bookworm, 6.1; NAPITAP_KERNEL_PKG names
# another) and a minimal Debian 12 root filesystem (debootstrap --variant=
# minbase, plus iproute2, kmod and procps; util-linux's setpriv, unshare and
# nsenter come with minbase) holding the kernel's modules, packed into one
# uncompressed cpio that the kernel unpacks as its initramfs and runs from
# (the cloud kernel has no 9p; ext4 on virtio-blk would need a module
# before root is mounted; an initramfs needs none). Its /init (init.sh) and
# the test binaries come in a second cpio that kernel_test.go appends.
#
#   test/e2e/kernel/rootfs.sh CACHE_DIR   prints the guest's directory:
#                                         vmlinuz, config (the kernel's),
#                                         rootfs.cpio, INFO
#
# The directory's name is a hash of this script and the kernel package, so
# changing either builds anew; a build goes to a temporary
# directory renamed into place at the end, so a killed one leaves nothing
# that looks complete. Needs root, debootstrap, apt-get with package lists,
# dpkg-deb and busybox (its cpio): hack/deps.sh kernel.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:?usage: $0 CACHE_DIR}
pkg=${NAPITAP_KERNEL_PKG:-linux-image-cloud-amd64}
suite=bookworm

key=$( (cat "$here/rootfs.sh"; echo "$pkg $suite") | sha256sum | cut -c1-12)
out=$cache/guest-$key
if [ -s "$out/vmlinuz" ] && [ -s "$out/rootfs.cpio" ] && [ -s "$out/INFO" ]; then
	echo "$out"
	exit 0
fi
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -s "$out/INFO" ]; then # built while we waited for the lock
	echo "$out"
	exit 0
fi
rm -rf "$cache"/.build-* "$out"
tmp=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)

# The concrete kernel package behind the metapackage.
kpkg=$pkg
for _ in 1 2 3 4 5; do
	dep=$(apt-cache depends "$kpkg" | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -1)
	[ -n "$dep" ] || break
	kpkg=$dep
done
(cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$kpkg" >&2)
deb=$(ls "$tmp"/*.deb)
t_kernel=$(($(date +%s) - start))

root=$tmp/root
debootstrap --variant=minbase --include=iproute2,kmod,procps "$suite" "$root" >"$tmp/debootstrap.log" 2>&1 ||
	{ tail -20 "$tmp/debootstrap.log" >&2; exit 1; }
t_debootstrap=$(($(date +%s) - start - t_kernel))

# Not into the root: tar would put a directory in place of its /lib
# symlink (merged /usr).
dpkg-deb -x "$deb" "$tmp/kernel"
kver=$(basename "$(ls "$tmp"/kernel/boot/vmlinuz-*)")
kver=${kver#vmlinuz-}
cp "$tmp/kernel/boot/vmlinuz-$kver" "$tmp/vmlinuz"
cp "$tmp/kernel/boot/config-$kver" "$tmp/config"
mkdir -p "$root/usr/lib/modules"
cp -a "$tmp/kernel/lib/modules/$kver" "$root/usr/lib/modules/"
chroot "$root" /usr/sbin/depmod "$kver"
# What a guest that runs once does not need.
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
	"$root"/usr/share/locale/* "$root"/usr/share/man/* "$root"/usr/share/info/*
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | busybox cpio -o -H newc 2>/dev/null) >"$tmp/rootfs.cpio"

glibc=$(chroot "$root" /usr/bin/dpkg-query -W -f='${Version}' libc6)
cat >"$tmp/INFO" <<INFO
kernel-package: $kpkg
kernel-deb: $(basename "$deb")
kernel-release: $kver
suite: $suite
glibc: $glibc
rootfs-bytes: $(stat -c %s "$tmp/rootfs.cpio")
built: $(date -u +%FT%TZ) in $(($(date +%s) - start))s (kernel download ${t_kernel}s, debootstrap ${t_debootstrap}s)
INFO
rm -rf "$root" "$tmp/kernel" "$deb" "$tmp/debootstrap.log"
chmod 0755 "$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
