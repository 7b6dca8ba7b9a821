#!/usr/bin/env bash
# Builds napitap's kind node image offline (make kind-node-image): kind's
# node image contract (kind v0.33.0 images/base and pkg/build/nodeimage:
# systemd as PID 1 under kind's entrypoint, containerd with CRI and runc,
# kubelet, kubeadm, kubectl, CNI plugins in /opt/cni/bin, crictl,
# /kind/version, and every image kubeadm needs already in containerd's
# k8s.io namespace, since nothing can be pulled) from:
#   - a Debian 12 rootfs (debootstrap from Debian's packages: systemd,
#     containerd 1.6.20, runc 1.1.5, iptables, ...), cached as a tarball;
#   - kind's own base files (entrypoint, units, containerd config), from
#     the sigs.k8s.io/kind module;
#   - the Kubernetes binaries test/e2e/node/build.sh builds from the Go
#     module proxy (v1.37.2, or K8S_VERSION's release), and crictl, CoreDNS
#     (the version that release's kubeadm names) and the CNI plugins, also
#     Go modules;
#   - images made here from static binaries (test/e2e/kind/imagepack):
#     pause, kube-apiserver, kube-controller-manager, kube-scheduler,
#     kube-proxy (with Debian's nft), CoreDNS and etcd, imported into the
#     rootfs's containerd by containerd itself, chrooted in a mount and
#     PID namespace of its own with no CRI;
#   - napitap's additions in test/e2e/kind/node/ (the first entrypoint,
#     the pod network in place of kindnetd).
# The result is `docker import`ed as $KIND_NODE_IMAGE (default
# napitap.local/kind-node:<k8s version>) with a label holding a stamp of
# all its inputs; a rerun with the same inputs does nothing. Everything
# lands in the gitignored .cache/kind/. Prints the image's name on stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cache=$root/.cache/kind
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
export GOTOOLCHAIN=local

kind_version=v0.33.0
crictl_version=v1.37.0
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
# kind's base packages (images/base/Dockerfile) less nfs-common and
# open-iscsi, plus Debian's containerd and runc, dbus and socat.
packages=systemd,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,fuse-overlayfs,e2fsprogs,bash,ca-certificates,curl,jq,procps,containerd,runc,iputils-ping,socat

log() { echo "nodeimage.sh: $*" >&2; }
start=$(date +%s)
mkdir -p "$cache/bin"

# Kubernetes, then the other Go binaries (each only when missing).
k8s=$(bash "$root/test/e2e/node/build.sh" --path)
k8s_version=${k8s##*/k8s-}
image=${KIND_NODE_IMAGE:-napitap.local/kind-node:$k8s_version}
gobin() { # name package@version
	[ -x "$cache/bin/$1" ] || { log "go install $2"; GOBIN=$cache/bin CGO_ENABLED=0 go install -trimpath -ldflags=-s\ -w "$2"; }
}
gobin kind sigs.k8s.io/kind@$kind_version
gobin crictl sigs.k8s.io/cri-tools/cmd/crictl@$crictl_version
cni_version=$(cd "$root" && go list -m -f '{{.Version}}' github.com/containernetworking/plugins)
for p in main/ptp main/bridge main/loopback ipam/host-local; do
	[ -x "$cache/cni-$cni_version/${p#*/}" ] || {
		log "go install CNI plugin ${p#*/} $cni_version"
		GOBIN=$cache/cni-$cni_version CGO_ENABLED=0 go install -trimpath -ldflags='-s -w' "github.com/containernetworking/plugins/plugins/$p@$cni_version"
	}
done
(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$cache/bin/" ./test/e2e/crihelp/pause ./test/e2e/kind/imagepack)
kind_src=$(cd "$cache" && go mod download -json sigs.k8s.io/kind@$kind_version | jq -r .Dir)
base=$kind_src/images/base/files

# What kubeadm will run, and the sandbox image kind's containerd config names.
mapfile -t kubeadm_images < <("$k8s/kubeadm" config images list --kubernetes-version "$k8s_version" 2>/dev/null)
# CoreDNS at the version kubeadm names, from the module proxy, one binary
# per version (another K8S_VERSION's kubeadm names another). Earlier builds
# kept one in bin/: moved in where it is that version.
coredns_version=$(printf '%s\n' "${kubeadm_images[@]}" | sed -n 's|.*/coredns:||p')
coredns=$cache/coredns-$coredns_version/coredns
if [ ! -x "$coredns" ]; then
	mkdir -p "${coredns%/*}"
	if [ -x "$cache/bin/coredns" ] && "$cache/bin/coredns" -version | grep -qx "CoreDNS-${coredns_version#v}"; then
		mv "$cache/bin/coredns" "$coredns"
	else
		log "go install github.com/coredns/coredns@$coredns_version"
		GOBIN=${coredns%/*} CGO_ENABLED=0 go install -trimpath -ldflags='-s -w' "github.com/coredns/coredns@$coredns_version"
	fi
fi
sandbox=$(sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p' "$base/etc/containerd/config.toml")
etcd_version=$("$k8s/etcd" --version | sed -n 's/^etcd Version: //p')

stamp=$({
	echo "$packages $suite $kind_version $crictl_version $cni_version ${kubeadm_images[*]} $sandbox $etcd_version"
	cat "$0" "$here"/node/* "$k8s/stamp"
	sha256sum "$cache/bin/pause" "$cache/bin/crictl" "$coredns" "$cache/cni-$cni_version"/*
} | sha256sum | cut -c1-16)
if [ "$(docker image inspect -f '{{index .Config.Labels "napitap.kind.stamp"}}' "$image" 2>/dev/null)" = "$stamp" ]; then
	log "$image is up to date (stamp $stamp)"
	echo "$image"
	exit 0
fi
log "building $image (stamp $stamp): Kubernetes $k8s_version, kind $kind_version base files, Debian $suite"

# The Debian rootfs, cached by its package list.
debian=$cache/debian-$suite-$(echo "$packages $mirror" | sha256sum | cut -c1-12).tar
if [ ! -f "$debian" ]; then
	command -v debootstrap >/dev/null || { log "debootstrap is missing: apt-get install debootstrap"; exit 1; }
	log "debootstrap $suite ($mirror)"
	t=$(mktemp -d "$cache/debootstrap.XXXXXX")
	debootstrap --variant=minbase --include="$packages" "$suite" "$t/rootfs" "$mirror" >"$t/log" 2>&1 ||
		{ tail -20 "$t/log" >&2; rm -rf "$t"; exit 1; }
	rm -rf "$t/rootfs/var/cache/apt/archives/"*.deb "$t/rootfs/var/lib/apt/lists/"*
	tar -C "$t/rootfs" --numeric-owner -cf "$debian.tmp" . && mv "$debian.tmp" "$debian"
	rm -rf "$t"
fi

work=$(mktemp -d "$cache/build.XXXXXX")
rootfs=$work/rootfs
cleanup() {
	# Nothing stays mounted: the import's mounts die with its namespace.
	rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$rootfs"
tar -C "$rootfs" --numeric-owner -xf "$debian"
in_root() { chroot "$rootfs" "$@"; }

# kind's base image (images/base/Dockerfile), on Debian's containerd.
install -m 0755 "$base"/usr/local/bin/* "$rootfs/usr/local/bin/"
mkdir -p "$rootfs/kind/bin" "$rootfs/etc/containerd" "$rootfs/etc/systemd/system/kubelet.service.d"
cp -r "$base"/kind/. "$rootfs/kind/"
chmod 0755 "$rootfs"/kind/bin/*
for f in crictl.yaml containerd/config.toml default/kubelet sysctl.d/10-network-magic.conf sysctl.d/10-network-security.conf \
	systemd/system/kubelet.slice systemd/system/undo-mount-hacks.service systemd/system/kubelet.service \
	systemd/system/containerd.service systemd/system/kubelet.service.d/10-kubeadm.conf systemd/system/kubelet.service.d/11-kind.conf; do
	install -D -m 0644 "$base/etc/$f" "$rootfs/etc/$f"
done
# kind's containerd.service runs /usr/local/bin/containerd; Debian's is in /usr/bin.
ln -sf /usr/bin/containerd "$rootfs/usr/local/bin/containerd"
in_root sh -c '
	find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
	rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
		/lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
		/lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
	echo ReadKMsg=no >>/etc/systemd/journald.conf
	ln -sf /usr/lib/systemd/systemd /sbin/init
	systemctl enable kubelet.service containerd.service undo-mount-hacks.service
	systemctl mask systemd-binfmt.service systemd-sysctl.service
	mkdir -p /etc/kubernetes/manifests /opt/cni/bin
	ctr oci spec | jq ".hooks.createContainer[.hooks.createContainer|length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}" \
		| jq "del(.process.rlimits)" >/etc/containerd/cri-base.json
	update-alternatives --set iptables /usr/sbin/iptables-legacy >/dev/null
	update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy >/dev/null
' 2>&1 | sed 's/^/nodeimage.sh: chroot: /' >&2

# napitap's additions.
install -m 0755 "$here/node/napitap-node-entrypoint" "$rootfs/usr/local/bin/"
install -m 0755 "$here/node/podnet.sh" "$rootfs/kind/bin/"
install -m 0644 "$here/node/podnet.service" "$rootfs/etc/systemd/system/"
in_root systemctl enable podnet.service 2>&1 | sed 's/^/nodeimage.sh: chroot: /' >&2

# Kubernetes (kind copies kubeadm, kubelet and kubectl to /usr/bin), crictl, CNI.
install -m 0755 "$k8s/kubeadm" "$k8s/kubelet" "$k8s/kubectl" "$rootfs/usr/bin/"
install -m 0755 "$cache/bin/crictl" "$rootfs/usr/local/bin/"
install -m 0755 "$cache/cni-$cni_version"/* "$rootfs/opt/cni/bin/"
printf '%s' "$k8s_version" >"$rootfs/kind/version"

# The images: each a static binary, tagged as kubeadm (and containerd's
# sandbox_image) name them. etcd is the version the apiserver's module
# graph pins, tagged as such: cluster.yaml tells kubeadm its tag.
mkdir -p "$work/images"
pack() { # ref path-in-image binary [rootfs-file...]: the binary at that path, its
	# entrypoint; each rootfs file (and the libraries it links) at its path
	local ref=$1 path=$2 bin=$3 d f lib
	d=$(mktemp -d "$work/img.XXXXXX")
	mkdir -p "$d/tmp" "$d/etc" "$d/${path%/*}"
	chmod 1777 "$d/tmp"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$d/etc/passwd"
	printf 'root:x:0:\nnobody:x:65534:\n' >"$d/etc/group"
	cp "$bin" "$d/$path"
	for f in "${@:4}"; do
		for lib in "$f" /etc/ld.so.cache $(chroot "$rootfs" ldd "$f" | grep -o '/[^ ]*'); do
			(cd "$rootfs" && cp -L --parents ".$lib" "$d/")
		done
	done
	"$cache/bin/imagepack" -o "$work/images/$(echo "$ref" | tr /: __).tar" -ref "$ref" -entrypoint "$path" "$d"
	echo "$ref" >>"$rootfs/kind/images"
}
for ref in "${kubeadm_images[@]}"; do
	case $ref in
	*/kube-apiserver:* | */kube-controller-manager:* | */kube-scheduler:*)
		name=${ref##*/}
		name=${name%%:*}
		pack "$ref" "/usr/local/bin/$name" "$k8s/$name"
		;;
	# kube-proxy in nftables mode (cluster.sh) runs Debian's nft.
	*/kube-proxy:*) pack "$ref" /usr/local/bin/kube-proxy "$k8s/kube-proxy" /usr/sbin/nft ;;
	*/etcd:*) pack "${ref%:*}:$etcd_version-napitap" /usr/local/bin/etcd "$k8s/etcd" ;;
	*/pause:*) pack "$ref" /pause "$cache/bin/pause" ;;
	*/coredns:*) pack "$ref" /coredns "$coredns" ;;
	*) log "no image for $ref: what runs it will not start" ;;
	esac
done
case " ${kubeadm_images[*]} " in *" $sandbox "*) ;; *) pack "$sandbox" /pause "$cache/bin/pause" ;; esac

log "importing $(ls "$work/images" | wc -l) images into the rootfs's containerd (k8s.io namespace)"
cat >"$work/containerd-import.toml" <<'TOML'
version = 2
root = "/var/lib/containerd"
state = "/run/containerd-import"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "/run/containerd-import/containerd.sock"
TOML
mkdir -p "$rootfs/import"
cp "$work/containerd-import.toml" "$work"/images/*.tar "$rootfs/import/"
# A mount and PID namespace of its own: the mounts and containerd end with it.
unshare --mount --pid --fork --propagation private /bin/sh -euc '
	r=$1
	mount -t proc proc "$r/proc"
	mount --rbind /dev "$r/dev"
	mount -t tmpfs tmpfs "$r/run"
	mount -t tmpfs tmpfs "$r/tmp"
	exec chroot "$r" /bin/sh -euc "
		containerd --config /import/containerd-import.toml >/tmp/containerd.log 2>&1 &
		pid=\$!
		for i in \$(seq 100); do [ -S /run/containerd-import/containerd.sock ] && break; sleep 0.1; done
		for f in /import/*.tar; do
			ctr -a /run/containerd-import/containerd.sock -n k8s.io images import --no-unpack \$f >/dev/null ||
				{ cat /tmp/containerd.log; exit 1; }
		done
		ctr -a /run/containerd-import/containerd.sock -n k8s.io images ls -q
		kill \$pid; wait \$pid || true
	"
' sh "$rootfs" 2>&1 | sed 's/^/nodeimage.sh: containerd: /' >&2
rm -rf "$rootfs/import" "$rootfs/run/containerd-import"

# Leave out what a node never reads.
rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
	"$rootfs"/var/log/* "$rootfs"/var/cache/debconf/*-old "$rootfs"/etc/machine-id
: >"$rootfs/etc/machine-id"

old=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
log "docker import (rootfs $(du -sh "$rootfs" | cut -f1))"
# docker import takes no STOPSIGNAL: a FROM-only build adds it (systemd
# stops on SIGRTMIN+3), with the legacy builder, which pulls nothing.
tar -C "$rootfs" --numeric-owner -c . | docker import \
	--change 'ENV container=docker' \
	--change 'ENTRYPOINT ["/usr/local/bin/napitap-node-entrypoint", "/usr/local/bin/entrypoint", "/sbin/init"]' \
	- "$image-rootfs" >/dev/null
printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\nLABEL napitap.kind.stamp=%s napitap.kind.etcd-tag=%s\n' "$image-rootfs" "$stamp" "$etcd_version-napitap" |
	DOCKER_BUILDKIT=0 docker build -q -t "$image" - >/dev/null 2>"$work/build.log" || { cat "$work/build.log" >&2; exit 1; }
docker rmi "$image-rootfs" >/dev/null
# The previous build, unless a container still uses it.
if [ -n "$old" ]; then docker rmi "$old" >/dev/null 2>&1 || true; fi
log "built $image in $(($(date +%s) - start)) s: $(docker image inspect -f '{{.Size}}' "$image" | numfmt --to=iec)"
echo "$image"
