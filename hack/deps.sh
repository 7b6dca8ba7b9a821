#!/usr/bin/env bash
# Checks for the programs a make target calls and, only where one is
# missing and apt-get exists, installs its Debian package.
#
#   hack/deps.sh demo   ip and tc (iproute2): all the demo calls
#   hack/deps.sh test   the demo's, plus what the tests call: QEMU (TCG is
#                       enough), a static busybox and dpkg-deb/xz for the
#                       guest initramfs, apt package lists for
#                       `apt-get download` of the guest kernel,
#                       nsenter/unshare, containerd and runc (CRI and node
#                       e2e), crun (the CRI e2e's second OCI runtime, CRI-O's
#                       and OpenShift's), libvirtd with its QEMU driver, virsh and
#                       xmllint (the libvirt e2e runs a libvirtd of its own;
#                       no service is set up on the node), an image
#                       builder (deploy/test builds the image), and gcc
#                       (cgo: the tests' attacker unshares its user
#                       namespace before Go starts, internal/ownuserns),
#                       qemu-user-static (make test-arm64), and perf
#                       (napitap-bench capacity --split: perf sched)
#   hack/deps.sh kind   make e2e-kind's: jq, debootstrap (the node image's
#                       Debian 12 root) and an image builder; Docker's
#                       engine itself the machine provides
#   hack/deps.sh kubevirt make kubevirt-images': jq, debootstrap (the
#                       Debian 12 roots of virt-handler and virt-launcher),
#                       gcc with libvirt's headers (libvirt-dev: virt-launcher
#                       links libvirt 9.0 through cgo; container-disk is C,
#                       linked static against glibc's libc.a from libc6-dev),
#                       pkg-config and setcap (libcap2-bin)
#   hack/deps.sh kernel make test-kernel's: QEMU, debootstrap (the guest's
#                       Debian 12 root), busybox (its cpio), dpkg-deb,
#                       flock, apt package lists (the guest kernel) and gcc
#                       (cgo test binaries)
#   hack/deps.sh image  an image builder for make image: docker with an engine
#                       behind it, podman or buildah; where none works, Debian's
#                       buildah (a docker client alone is no builder)
#
# Elsewhere (no apt-get) it names what is missing and the Debian package
# that has it, and exits 1: install the equivalent and run make again.
set -euo pipefail
target=${1:-test}

missing=()   # Debian packages
absent=()    # "program (package)", for the message without apt-get
need_cmd() { # need_cmd PROGRAM PACKAGE
	command -v "$1" >/dev/null && return
	absent+=("$1 ($2)")
	[[ " ${missing[*]-} " == *" $2 "* ]] || missing+=("$2")
}
need_pkg() { # need_pkg PACKAGE WHAT (no program to look for)
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed' && return
	absent+=("$2 ($1)")
	missing+=("$1")
}

# need_builder: make image's, unless one already works (image.sh asks it).
need_builder() {
	"$(dirname "$0")/image.sh" builder >/dev/null 2>&1 || need_cmd buildah buildah
}

need_lists=0
case $target in
demo)
	need_cmd ip iproute2
	need_cmd tc iproute2
	;;
image) need_builder ;;
kind)
	need_builder
	need_cmd jq jq
	need_cmd debootstrap debootstrap
	# The VM pods' image (test/e2e/kind/suite): this machine's QEMU and
	# busybox, and a Debian guest kernel fetched with apt-get download.
	need_cmd qemu-system-x86_64 qemu-system-x86
	need_pkg busybox-static "a static /bin/busybox"
	need_cmd dpkg-deb dpkg
	need_cmd xz xz-utils
	compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null || need_lists=1
	;;
kubevirt)
	need_cmd jq jq
	need_cmd debootstrap debootstrap
	need_cmd gcc gcc
	need_cmd pkg-config pkg-config
	need_cmd setcap libcap2-bin
	need_pkg libc6-dev "glibc's static libc.a (container-disk)"
	need_pkg libvirt-dev "libvirt's headers (virt-launcher, cgo)"
	;;
kernel)
	need_cmd qemu-system-x86_64 qemu-system-x86
	need_cmd debootstrap debootstrap
	need_cmd busybox busybox-static
	need_cmd dpkg-deb dpkg
	need_cmd flock util-linux
	need_cmd gcc gcc
	compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null || need_lists=1
	;;
test)
	need_cmd ip iproute2
	need_cmd tc iproute2
	need_builder
	need_cmd qemu-system-x86_64 qemu-system-x86
	need_pkg busybox-static "a static /bin/busybox"
	need_cmd dpkg-deb dpkg
	need_cmd xz xz-utils
	need_cmd nsenter util-linux
	need_cmd unshare util-linux
	need_cmd containerd containerd
	need_cmd runc runc
	need_cmd crun crun
	need_cmd libvirtd libvirt-daemon
	need_pkg libvirt-daemon-driver-qemu "libvirt's QEMU driver"
	need_cmd virsh libvirt-clients
	need_cmd xmllint libxml2-utils
	need_cmd gcc gcc
	need_cmd qemu-aarch64-static qemu-user-static
	need_cmd perf linux-perf
	compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null || need_lists=1
	;;
*)
	echo "usage: $0 demo|test|image|kind|kubevirt|kernel" >&2
	exit 2
	;;
esac
command -v go >/dev/null || { echo "deps: Go 1.26.8+ (go.mod's) must be on PATH or in /usr/local/go/bin" >&2; exit 1; }

if [ ${#missing[@]} -eq 0 ] && [ "$need_lists" = 0 ]; then
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "deps: make $target needs, and this machine has no apt-get to install:" >&2
	printf '  %s\n' "${absent[@]}" >&2
	[ "$need_lists" = 0 ] || echo "  apt package lists (the guest kernel comes from Debian's archive)" >&2
	echo "deps: in parentheses is the Debian package; install its equivalent and run make again" >&2
	exit 1
fi
if [ "$(id -u)" != 0 ]; then
	echo "deps: need root to install: ${missing[*]:-} (and/or apt-get update)" >&2
	exit 1
fi
apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
