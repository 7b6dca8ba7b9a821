#!/usr/bin/env bash
# Installs the Debian packages napitap's demo and tests need, if missing:
# iproute2 (ip, tc), util-linux (nsenter, unshare), QEMU (TCG is enough, no
# KVM needed), a static busybox for the guest initramfs, and the tools to
# unpack a Debian kernel package; containerd (with ctr) and runc for the CRI
# e2e (test/e2e/cri); libvirt's daemon with its QEMU driver, virsh, and
# xmllint (which virt-xml-validate runs) for the libvirt e2e
# (test/e2e/libvirt_test.go; no libvirt-daemon-system: the test runs its
# own libvirtd with its own config and dirs, and no service is set up on
# the node). Idempotent; runs `apt-get update` only when
# something is missing (or apt has no package lists, which `apt-get
# download` of the guest kernel needs).
set -euo pipefail
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || missing+=(busybox-static)
command -v dpkg-deb >/dev/null || missing+=(dpkg)
command -v xz >/dev/null || missing+=(xz-utils)
command -v ip >/dev/null || missing+=(iproute2)
command -v tc >/dev/null || missing+=(iproute2)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v make >/dev/null || missing+=(make)
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
command -v libvirtd >/dev/null || missing+=(libvirt-daemon)
dpkg-query -W -f='${Status}' libvirt-daemon-driver-qemu 2>/dev/null | grep -q 'ok installed' || missing+=(libvirt-daemon-driver-qemu)
command -v virsh >/dev/null || missing+=(libvirt-clients)
command -v xmllint >/dev/null || missing+=(libxml2-utils)
command -v unshare >/dev/null || missing+=(util-linux)
lists_ok=0
compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null && lists_ok=1
if [ ${#missing[@]} -gt 0 ] || [ "$lists_ok" = 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "deps: need root to install: ${missing[*]:-} (and/or apt-get update)" >&2
		exit 1
	fi
	apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v go >/dev/null || { echo "Go 1.26+ must be on PATH (e.g. /usr/local/go/bin)" >&2; exit 1; }
