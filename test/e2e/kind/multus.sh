#!/usr/bin/env bash
# Multus v4.2.2 (thin plugin) for the kind suite, offline: an image and
# its DaemonSet manifest, both from the Go module proxy.
#
#   - the binaries the release image's thin DaemonSet runs
#     (images/Dockerfile, deployments/multus-daemonset.yml): multus, as the
#     node e2e builds it (test/e2e/node/multus.sh), and install_multus,
#     thin_entrypoint and passthru, from the same module at the same
#     versions (test/e2e/node/multusbuild);
#   - one fix to v4.2.2's thin_entrypoint, as upstream made it after the
#     release (multus-cni PR 1451; openshift/multus-cni PR 287 with
#     net.JoinHostPort, as here): it writes the kubeconfig's server as
#     https://[HOST]:PORT even for an IPv4 HOST, which Go 1.24.8 and later
#     (CVE-2025-47912) refuse. The release image's Go 1.23 accepted it; a
#     multus built here with Go 1.26 fails every ADD with "error getting
#     k8s client: host must be a URL or a host:port pair:
#     "https://[10.96.0.1]:443"". The patched copy is built in a package of
#     its own inside multusbuild, so its imports resolve as the release's;
#   - the image: those binaries at the release image's paths
#     (/thin_entrypoint, /install_multus, /usr/src/multus-cni/bin/multus
#     and passthru), no base image, packed by test/e2e/kind/imagepack and
#     tagged as the release's (ghcr.io/k8snetworkplumbingwg/multus-cni:v4.2.2),
#     as the node image tags its own control plane images;
#   - the manifest: deployments/multus-daemonset.yml of the module's v4.2.2
#     source (checked against go.sum), its moving :snapshot image pinned
#     to that tag.
#
# Writes OUT/image.tar (docker-archive: kind load image-archive, ctr images
# import) and OUT/multus-daemonset.yml, OUT being the gitignored
# .cache/kind/multus-v4.2.2/; only what is missing or stale. Prints OUT.
set -euo pipefail

version=v4.2.2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mod=$root/test/e2e/node/multusbuild
pkg=gopkg.in/k8snetworkplumbingwg/multus-cni.v4
ref=ghcr.io/k8snetworkplumbingwg/multus-cni:$version
out=$root/.cache/kind/multus-$version
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
export GOTOOLCHAIN=local
log() { echo "multus.sh: $*" >&2; }

multus=$(bash "$root/test/e2e/node/multus.sh" --path)/multus
src=$(cd "$mod" && GOFLAGS=-mod=readonly go mod download -json "$pkg@$version" | jq -r .Dir)
[ -f "$src/deployments/multus-daemonset.yml" ] || { log "no deployments/multus-daemonset.yml in $src"; exit 1; }

stamp=$({
	cat "$0" "$mod/go.mod" "$mod/go.sum" "$src/deployments/multus-daemonset.yml" "$root/test/e2e/kind/imagepack/main.go" "$root/test/e2e/crihelp/image.go"
	go version
	sha256sum "$multus"
} | sha256sum | cut -c1-16)
if [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ] && [ -f "$out/image.tar" ] && [ -f "$out/multus-daemonset.yml" ]; then
	echo "$out"
	exit 0
fi
start=$(date +%s)
mkdir -p "$out"
work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The image's tree, as the release image lays it out.
img=$work/image
mkdir -p "$img/usr/src/multus-cni/bin" "$img/tmp" "$img/etc"
chmod 1777 "$img/tmp"
patched=$(mktemp -d "$mod/thin_entrypoint.XXXXXX")
trap 'rm -rf "$work" "$patched"' EXIT
sed -e 's|^\t"fmt"$|\t"fmt"\n\t"net"|' \
	-e 's|fmt.Sprintf("%s://\[%s\]:%s", kubeProtocol, kubeHost, kubePort)|kubeProtocol + "://" + net.JoinHostPort(kubeHost, kubePort)|' \
	"$src/cmd/thin_entrypoint/main.go" >"$patched/main.go"
if [ "$(diff "$src/cmd/thin_entrypoint/main.go" "$patched/main.go" | grep -c '^>')" != 2 ]; then
	log "the thin_entrypoint fix no longer applies to $src/cmd/thin_entrypoint/main.go"
	exit 1
fi
(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
	-ldflags "-s -w -X $pkg/pkg/multus.version=$version" -o "$work/" \
	"$pkg/cmd/install_multus" "$pkg/cmd/passthru-cni" &&
	CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" -o "$work/thin_entrypoint" "./${patched##*/}")
install -m 0755 "$work/install_multus" "$work/thin_entrypoint" "$img/"
install -m 0755 "$multus" "$img/usr/src/multus-cni/bin/multus"
install -m 0755 "$work/passthru-cni" "$img/usr/src/multus-cni/bin/passthru"
install -m 0644 "$src/LICENSE" "$img/usr/src/multus-cni/LICENSE"
printf 'root:x:0:0:root:/root:/sbin/nologin\n' >"$img/etc/passwd"
printf 'root:x:0:\n' >"$img/etc/group"
(cd "$root" && CGO_ENABLED=0 go build -o "$work/imagepack" ./test/e2e/kind/imagepack)
"$work/imagepack" -o "$work/image.tar" -ref "$ref" -entrypoint /thin_entrypoint "$img"

# The release's manifest with its image pinned: nothing else changes.
sed "s#ghcr.io/k8snetworkplumbingwg/multus-cni:snapshot#$ref#g" "$src/deployments/multus-daemonset.yml" >"$work/multus-daemonset.yml"
if grep -q ':snapshot' "$work/multus-daemonset.yml" || [ "$(grep -c "image: $ref\$" "$work/multus-daemonset.yml")" != 2 ]; then
	log "could not pin both images of $src/deployments/multus-daemonset.yml to $ref"
	exit 1
fi
mv -f "$work/image.tar" "$work/multus-daemonset.yml" "$out/"
echo "$stamp" >"$out/stamp"
log "$ref ($(du -h "$out/image.tar" | cut -f1)) and its DaemonSet in $out, in $(($(date +%s) - start)) s"
echo "$out"
