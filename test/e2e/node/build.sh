#!/usr/bin/env bash
# Builds the real-node e2e's binaries, kube-apiserver, kubelet, kubectl,
# kube-controller-manager and kube-scheduler (k8s.io/kubernetes v1.37.2; the
# last two run the DaemonSet as a cluster does), kubeadm and kube-proxy (for
# the kind node image, test/e2e/kind/nodeimage.sh) and etcd
# (go.etcd.io/etcd/server/v3, the version that release pins), from the Go
# module proxy through the nested wrapper module test/e2e/node/k8sbuild,
# into the gitignored .cache/k8s-<version>/. It builds only when a binary
# is missing or the wrapper module or Go changed since (a stamp file
# records both), so a rerun takes well under a second; a first build takes
# several minutes on 2 cores. `--path` prints the directory on stdout (the
# test calls that).
#
# K8S_VERSION=v1.MINOR.PATCH builds another release instead, through its
# own wrapper module test/e2e/node/k8sbuild-v1.MINOR (whose go.mod requires
# exactly that k8s.io/kubernetes), into .cache/k8s-<that version>/; the kind
# scripts read the same variable (test/e2e/kind/README.md, "Kubernetes
# 1.30"). Unset, or the default version, changes nothing.
set -euo pipefail
version=v1.37.2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mod=$here/k8sbuild
if [ -n "${K8S_VERSION:-}" ] && [ "$K8S_VERSION" != "$version" ]; then
	version=$K8S_VERSION
	mod=$here/k8sbuild-${version%.*}
	[[ $version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "build.sh: K8S_VERSION=$version is not v1.MINOR.PATCH" >&2; exit 1; }
	grep -Eq "^[[:space:]]*(require )?k8s\.io/kubernetes $version( |\$)" "$mod/go.mod" 2>/dev/null || {
		echo "build.sh: K8S_VERSION=$version needs a wrapper module $mod whose go.mod requires k8s.io/kubernetes $version" >&2
		exit 1
	}
fi
out=$root/.cache/k8s-$version
bins=(kube-apiserver kubelet kubectl kube-controller-manager kube-scheduler kubeadm kube-proxy etcd)

command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "Go 1.26+ must be on PATH (e.g. /usr/local/go/bin)" >&2; exit 1; }

stamp=$( { cat "$mod/go.mod" "$mod/go.sum" "$0"; go version; } | sha256sum | cut -d' ' -f1)
fresh=true
for b in "${bins[@]}"; do [ -x "$out/$b" ] || fresh=false; done
[ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ] || fresh=false

if ! $fresh; then
	echo "build.sh: building ${bins[*]} ($version) into $out" >&2
	mkdir -p "$root/.cache"
	tmp=$(mktemp -d "$root/.cache/k8s-build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	ver=k8s.io/component-base/version
	minor=${version#v1.}; minor=${minor%%.*}
	ldflags="-s -w -X $ver.gitVersion=$version -X $ver.gitMajor=1 -X $ver.gitMinor=$minor"
	ldflags+=" -X $ver.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$version"
	start=$(date +%s)
	# One go build for all: they share most packages (the controller
	# manager and the scheduler add some 160 of 2,850). The go.mod's
	# tool block names the main packages; -mod=readonly keeps go.sum as
	# committed.
	(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kube-proxy \
		go.etcd.io/etcd/server/v3)
	mv "$tmp/server" "$tmp/etcd" # go names the etcd main after server/v3 less its major version
	mkdir -p "$out"
	for b in "${bins[@]}"; do mv -f "$tmp/$b" "$out/$b"; done
	echo "$stamp" > "$out/stamp"
	echo "build.sh: built in $(( $(date +%s) - start )) s" >&2
fi
if [ "${1:-}" = --path ]; then
	echo "$out"
fi
