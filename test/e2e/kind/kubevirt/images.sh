#!/usr/bin/env bash
# KubeVirt v1.7.0 for the kind suite, offline (make kubevirt-images): the
# images its operator deploys for a VM and the release's operator and CR
# manifests, from the Go module proxy and Debian's packages only.
#
#   - the source: the module kubevirt.io/kubevirt@v1.7.0 with its staging
#     modules kubevirt.io/api and kubevirt.io/client-go at the same version
#     put back where its go.mod's replace directives point (a module zip
#     leaves out nested modules), built as the main module with its own
#     go.mod and go.sum (-mod=readonly). v1.7.0 is the newest release the
#     module proxy serves whole: v1.8.0 and later require
#     kubevirt.io/virt-template-api, which it refuses, and of v1.7.1 to
#     v1.7.4 it serves no kubevirt.io/kubevirt;
#   - the binaries as KubeVirt's Bazel rules put them in each image
#     (cmd/*/BUILD.bazel): static Go but for virt-launcher, which links
#     Debian's libvirt 9.0 through cgo (libvirt.org/go/libvirt), and
#     virt-handler, whose node labeller takes KVM's ioctl numbers from
#     <linux/kvm.h> through cgo (both run on the Debian rootfs they were
#     linked against); container-disk is a C program, linked static;
#   - virt-operator, virt-api and virt-controller: no base image (upstream's
#     is distroless base-debian12 plus a passwd file), user 1001, packed by
#     test/e2e/kind/imagepack from a directory;
#   - virt-handler and virt-launcher: a Debian 12 rootfs each (debootstrap
#     from Debian's apt, cached as a tarball) in place of upstream's
#     distroless base with CentOS Stream 9 packages: the launcher gets
#     libvirt 9.0 and QEMU 7.2 where upstream's has 10.10 and 9.1, the
#     handler nft, ip, qemu-img, findmnt and xorrisofs, which it runs.
#     libvirtd stands in for virtqemud (test/e2e/kind/kubevirt/virtqemud:
#     Debian 12 ships no modular daemons). Packed from a GNU tar of the
#     rootfs (owners, setuid bits and virt-launcher-monitor's
#     cap_net_bind_service kept) by imagepack -layer;
#   - each image tagged as the release's (quay.io/kubevirt/NAME:v1.7.0),
#     so that the release's own operator manifest, rendered here by the
#     module's tools/manifest-templator as hack/build-manifests.sh does for
#     a release, deploys them unchanged.
#
# virt-exportproxy (VMExport gate), virt-synchronization-controller
# (DecentralizedLiveMigration gate), pr-helper (PersistentReservation) and
# sidecar-shim (hook sidecars) are deployed only when asked for: not built.
#
# Writes OUT/images/NAME.tar (docker-archive: kind load image-archive,
# ctr images import), OUT/kubevirt-operator.yaml and OUT/kubevirt-cr.yaml
# (and OUT/bin/virtctl, the release's client: console, migrate, ...),
# OUT being the gitignored .cache/kubevirt-v1.7.0/; only what is missing
# or stale (a stamp per step). Prints OUT. Builds run under nice -n 19.
set -euo pipefail

version=v1.7.0
registry=quay.io/kubevirt
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
out=$root/.cache/kubevirt-$version
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=readonly
log() { echo "images.sh: $*" >&2; }
nice=(nice -n 19)
start=$(date +%s)
mkdir -p "$out/images"

# 1. The source, as the repository lays it out.
src=$out/src
if [ "$(cat "$src/.stamp" 2>/dev/null)" != "$version" ]; then
	log "kubevirt.io/kubevirt@$version and its staging modules from the module proxy"
	rm -rf "$src" "$src.tmp"
	dir() { (cd "$out" && go mod download -json "$1@$version" | jq -r .Dir); }
	cp -r "$(dir kubevirt.io/kubevirt)" "$src.tmp"
	chmod -R u+w "$src.tmp"
	for m in api client-go; do
		cp -r "$(dir kubevirt.io/$m)" "$src.tmp/staging/src/kubevirt.io/$m"
	done
	chmod -R u+w "$src.tmp"
	# The published client-go module requires kubevirt.io/api at a
	# pseudo-version where the repository's staging copy requires
	# v0.0.0-00010101000000-000000000000 (and replaces it by ../api): MVS
	# would then select a version the main module's go.mod does not name,
	# which -mod=readonly refuses. Put the repository's requirement back;
	# the two modules are otherwise the repository's staging tree.
	sed -i 's|^\tkubevirt.io/api v0\.0\.0-2[0-9.a-f-]*$|\tkubevirt.io/api v0.0.0-00010101000000-000000000000|' \
		"$src.tmp/staging/src/kubevirt.io/client-go/go.mod"
	grep -q '^	kubevirt.io/api v0.0.0-00010101000000-000000000000$' "$src.tmp/staging/src/kubevirt.io/client-go/go.mod" ||
		{ log "client-go's requirement of kubevirt.io/api is not the one this script fixes"; exit 1; }
	echo "$version" >"$src.tmp/.stamp"
	mv "$src.tmp" "$src"
fi

# 2. The binaries. The x_defs of version_x_defs() (client-go/version/def.bzl).
bin=$out/bin
static=(cmd/virt-operator tools/csv-generator cmd/virt-api cmd/virt-controller cmd/virt-chroot
	cmd/virt-launcher-monitor cmd/virt-freezer cmd/virt-probe cmd/virt-tail tools/manifest-templator cmd/virtctl)
cgo=(cmd/virt-launcher cmd/virt-handler)
stamp=$({
	echo "$version ${static[*]} ${cgo[*]}"
	go version
	gcc --version | head -1
	pkg-config --modversion libvirt
	sed -n '/^# 2\./,/^# 3\./p' "$0"
} | sha256sum | cut -c1-16)
if [ "$(cat "$bin/.stamp" 2>/dev/null)" != "$stamp" ]; then
	command -v pkg-config >/dev/null && pkg-config --exists libvirt || { log "libvirt's headers are missing: hack/deps.sh kubevirt (libvirt-dev)"; exit 1; }
	log "building KubeVirt $version's binaries into $bin"
	t=$(date +%s)
	rm -rf "$bin.tmp"
	mkdir -p "$bin.tmp"
	v=kubevirt.io/client-go/version
	ldflags="-s -w -X $v.gitVersion=$version -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
	(cd "$src" && CGO_ENABLED=0 "${nice[@]}" go build -trimpath -ldflags "$ldflags" -o "$bin.tmp/" "${static[@]/#/./}")
	(cd "$src" && CGO_ENABLED=1 "${nice[@]}" go build -trimpath -ldflags "$ldflags" -o "$bin.tmp/" "${cgo[@]/#/./}")
	"${nice[@]}" gcc -static -O2 -o "$bin.tmp/container-disk" "$src/cmd/container-disk-v2alpha/main.c"
	echo "$stamp" >"$bin.tmp/.stamp"
	rm -rf "$bin"
	mv "$bin.tmp" "$bin"
	log "binaries built in $(($(date +%s) - t)) s"
fi

# 3. The Debian rootfs of virt-handler and virt-launcher, each cached by
# its package list. The launcher: libvirtd and virtlogd (libvirt-daemon),
# the QEMU driver, virsh (node-labeller.sh), QEMU with SeaBIOS and iPXE,
# qemu-img, xorrisofs (cloud-init and config disks), nft and ip, and what
# the scripts of the image call. No OVMF: KubeVirt names RHEL's firmware
# files, so a VM here boots BIOS.
launcher_packages=libvirt-daemon,libvirt-daemon-driver-qemu,libvirt-clients,qemu-system-x86,qemu-utils,xorriso,nftables,iproute2,procps,psmisc,acl,ethtool,dmidecode
handler_packages=nftables,iproute2,qemu-utils,xorriso,procps,acl,kmod
debian() { # name packages: the cached tarball's path, debootstrapped when missing
	local tarball t
	tarball=$out/debian-$suite-$1-$(echo "$2 $mirror" | sha256sum | cut -c1-12).tar
	if [ ! -f "$tarball" ]; then
		command -v debootstrap >/dev/null || { log "debootstrap is missing: hack/deps.sh kubevirt"; exit 1; }
		log "debootstrap $suite for $1 ($mirror)"
		t=$(mktemp -d "$out/debootstrap.XXXXXX")
		"${nice[@]}" debootstrap --variant=minbase --include="$2" "$suite" "$t/rootfs" "$mirror" >"$t/log" 2>&1 ||
			{ tail -20 "$t/log" >&2; rm -rf "$t"; exit 1; }
		# What a container never reads.
		rm -rf "$t/rootfs/var/cache/apt/archives/"*.deb "$t/rootfs/var/lib/apt/lists/"* "$t/rootfs"/usr/share/doc/* \
			"$t/rootfs"/usr/share/man/* "$t/rootfs"/usr/share/info/* "$t/rootfs"/usr/share/locale/* "$t/rootfs"/var/log/*
		tar -C "$t/rootfs" --numeric-owner --xattrs -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
		rm -rf "$t"
	fi
	echo "$tarball"
}
launcher_rootfs=$(debian launcher "$launcher_packages")
handler_rootfs=$(debian handler "$handler_packages")

# 4. The images.
images=(virt-operator virt-api virt-controller virt-handler virt-launcher)
stamp=$({
	echo "$version $registry ${images[*]}"
	cat "$0" "$here/virtqemud" "$bin/.stamp" "$root/test/e2e/kind/imagepack/main.go" "$root/test/e2e/crihelp/image.go"
	echo "$launcher_rootfs $handler_rootfs"
} | sha256sum | cut -c1-16)
fresh=true
for i in "${images[@]}"; do [ -f "$out/images/$i.tar" ] || fresh=false; done
for f in kubevirt-operator.yaml kubevirt-cr.yaml; do [ -f "$out/$f" ] || fresh=false; done
if $fresh && [ "$(cat "$out/images/.stamp" 2>/dev/null)" = "$stamp" ]; then
	echo "$out"
	exit 0
fi
work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$root" && CGO_ENABLED=0 go build -o "$work/imagepack" ./test/e2e/kind/imagepack)
printf '%s' "$version" >"$work/version" # upstream's /.version (the //:get-version genrule)
# The PATH upstream's base (distroless) sets: the operator runs its
# components' binaries by name (`virt-handler`, `virt-operator`).
path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# virt-operator (with csv-generator), virt-api, virt-controller: the
# binaries in /usr/bin, /.version and the passwd file of upstream's
# passwd-image (nonroot-user, 1001), user 1001.
static_image() { # name binary...
	local d=$work/$1
	mkdir -p "$d/usr/bin" "$d/etc" "$d/tmp"
	chmod 1777 "$d/tmp"
	printf 'nonroot-user:x:1001:1001::/home/nonroot-user:/bin/bash\n' >"$d/etc/passwd"
	printf 'nonroot-user:x:1001:\n' >"$d/etc/group"
	install -m 0644 "$work/version" "$d/.version"
	for b in "${@:2}"; do install -m 0755 "$bin/$b" "$d/usr/bin/"; done
	"$work/imagepack" -o "$work/$1.tar" -ref "$registry/$1:$version" -entrypoint "/usr/bin/$1" -user 1001 -env "$path" "$d"
}
static_image virt-operator virt-operator csv-generator
static_image virt-api virt-api
static_image virt-controller virt-controller

# A Debian image: the rootfs, KubeVirt's files over it, the qemu user
# (107) both upstream images have, tarred with owners and xattrs.
debian_image() { # name rootfs-tarball entrypoint [user]
	local r=$work/$1-rootfs
	mkdir -p "$r"
	tar -C "$r" --numeric-owner --xattrs -xf "$2"
	grep -q '^qemu:' "$r/etc/group" || echo 'qemu:x:107:' >>"$r/etc/group"
	grep -q '^qemu:' "$r/etc/passwd" || echo 'qemu:x:107:107:qemu user:/home/qemu:/bin/bash' >>"$r/etc/passwd"
	install -m 0644 "$work/version" "$r/.version"
	install -m 0644 "$src/cmd/$1/nsswitch.conf" "$r/etc/nsswitch.conf"
	"${@:5}" # the image's own files
	# The same rootfs gives the same layer: sorted, every time at the epoch,
	# no atime or ctime and no PID in the pax headers --xattrs brings.
	tar -C "$r" --numeric-owner --xattrs --xattrs-include=security.capability --sort=name --mtime=@0 \
		--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -cf "$work/$1.layer.tar" .
	"$work/imagepack" -o "$work/$1.tar" -ref "$registry/$1:$version" -entrypoint "$3" ${4:+-user "$4"} -env "$path" -layer "$work/$1.layer.tar"
	rm -rf "$r" "$work/$1.layer.tar"
}

handler_files() {
	local r=$work/virt-handler-rootfs
	install -m 0755 "$bin/virt-handler" "$bin/virt-chroot" "$r/usr/bin/"
}
debian_image virt-handler "$handler_rootfs" /usr/bin/virt-handler "" handler_files

launcher_files() {
	local r=$work/virt-launcher-rootfs f
	install -m 0755 "$bin/virt-launcher" "$bin/virt-launcher-monitor" "$bin/virt-freezer" "$bin/virt-probe" \
		"$bin/virt-tail" "$bin/container-disk" "$src/cmd/virt-launcher/node-labeller/node-labeller.sh" "$r/usr/bin/"
	# upstream's setcaps rule: a non-root launcher binds low ports (passt, slirp).
	setcap cap_net_bind_service=+ep "$r/usr/bin/virt-launcher-monitor"
	install -m 0644 "$src/cmd/virt-launcher/qemu.conf" "$src/cmd/virt-launcher/virtqemud.conf" "$r/etc/libvirt/"
	install -D -m 0755 "$src/cmd/virt-launcher/qemu" "$r/etc/libvirt/hooks/qemu"
	install -m 0755 "$here/virtqemud" "$r/usr/sbin/virtqemud"
	# virt-launcher runs virtlogd -f /etc/libvirt/virtlogd.conf, which
	# Debian ships in libvirt-daemon-system (systemd units, polkit, ...:
	# not installed); without it virtlogd exits at once, and again each
	# second. Upstream's file (libvirt-daemon-log) sets nothing either.
	echo '# virtlogd: all settings at their defaults' >"$r/etc/libvirt/virtlogd.conf"
	# Debian's libvirt is built with QEMU's user and group libvirt-qemu, which
	# the QEMU driver of a root libvirtd resolves before it reads qemu.conf
	# (user = "qemu"): "Failed to parse user 'libvirt-qemu'" otherwise.
	# libvirt-daemon-system, not installed, would make them (64055).
	echo 'libvirt-qemu:x:64055:' >>"$r/etc/group"
	echo 'libvirt-qemu:x:64055:64055:Libvirt Qemu:/var/lib/libvirt:/usr/sbin/nologin' >>"$r/etc/passwd"
	install -d -m 0755 "$r/usr/lib64/qemu-kvm" "$r/home/qemu"
	# A root libvirtd logs to /var/log/libvirt/libvirtd.log and exits if it
	# cannot (node-labeller.sh's `virtqemud -d`); the rootfs has no /var/log.
	install -d -m 0700 "$r/var/log/libvirt"
	chown 107:107 "$r/home/qemu"
	# libvirtd as virtqemud: the QEMU driver alone, as in virtqemud (no
	# network, nwfilter, storage, ... to start in a pod).
	for f in "$r"/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/*.so; do
		case ${f##*/} in libvirt_driver_qemu.so) ;; *) rm -f "$f" ;; esac
	done
	[ -x "$r/usr/sbin/libvirtd" ] && [ -x "$r/usr/sbin/virtlogd" ] && [ -x "$r/usr/bin/qemu-system-x86_64" ] ||
		{ log "the launcher's rootfs lacks libvirtd, virtlogd or qemu-system-x86_64"; exit 1; }
}
debian_image virt-launcher "$launcher_rootfs" /usr/bin/virt-launcher "" launcher_files

# The release's manifests: hack/build-manifests.sh's two passes of
# manifest-templator over manifests/release/*.yaml.in and the module's
# manifests/generated/, with a release's values (hack/config-default.sh,
# DOCKER_PREFIX=quay.io/kubevirt, DOCKER_TAG=v1.7.0).
for m in kubevirt-operator kubevirt-cr; do
	(cd "$src" && "$bin/manifest-templator" --process-files --generated-manifests-dir=manifests/generated/ \
		--input-file="manifests/release/$m.yaml.in" >"$work/$m.yaml.in")
	(cd "$src" && "$bin/manifest-templator" --process-vars --namespace=kubevirt --cdi-namespace=cdi \
		--container-prefix="$registry" --container-tag="$version" --csv-version="${version#v}" \
		--image-pull-policy=IfNotPresent --verbosity=2 --package-name=kubevirt-dev --infra-replicas=0 \
		--kubevirt-logo-path=assets/kubevirt_logo.png --input-file="$work/$m.yaml.in" >"$work/$m.yaml")
	sed -i '${/^$/d;}' "$work/$m.yaml"
done
grep -q "image: $registry/virt-operator:$version\$" "$work/kubevirt-operator.yaml" ||
	{ log "kubevirt-operator.yaml does not name $registry/virt-operator:$version"; exit 1; }

for i in "${images[@]}"; do mv -f "$work/$i.tar" "$out/images/"; done
mv -f "$work/kubevirt-operator.yaml" "$work/kubevirt-cr.yaml" "$out/"
echo "$stamp" >"$out/images/.stamp"
for i in "${images[@]}"; do log "$registry/$i:$version: $(du -h "$out/images/$i.tar" | cut -f1)"; done
log "done in $(($(date +%s) - start)) s"
echo "$out"
