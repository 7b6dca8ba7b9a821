#!/usr/bin/env bash
# napitap end to end on a kind cluster (make e2e-kind): builds the image and
# loads it into a fresh two-node cluster, installs Multus (thin, pinned) and
# napitap (`deploy/`, as `kubectl apply -k` would), starts two pods on the
# napitap-bridge network and checks on their nodes, with the same assertions
# as every other e2e suite (test/e2e/nodecheck through napitap-verify), that
# each has its tap, wiring and queues in napitapd; then deletes the pods and
# checks that nothing is left. The cluster is deleted on exit.
#
# Needs: bash 4+, docker (BuildKit), kind, kubectl, curl, go. Environment:
#   KIND_CLUSTER     cluster name (napitap-e2e); must not exist yet
#   KIND_NODE_IMAGE  node image (default: kind's own for its version)
#   MULTUS_VERSION   Multus release to install (v4.2.2)
#   KEEP_CLUSTER=1   keep the cluster afterwards, to look around
#   TIMEOUT          kubectl wait timeout (180s)
set -euo pipefail

cd "$(dirname "$0")/../../.."

cluster=${KIND_CLUSTER:-napitap-e2e}
node_image=${KIND_NODE_IMAGE:-}
multus_version=${MULTUS_VERSION:-v4.2.2}
multus_manifest=https://raw.githubusercontent.com/k8snetworkplumbingwg/multus-cni/${multus_version}/deployments/multus-daemonset.yml
keep=${KEEP_CLUSTER:-0}
timeout=${TIMEOUT:-180s}
image=ghcr.io/napitap/napitap:e2e
socket=/run/napitap/napitapd.sock
pods=(napitap-e2e-a napitap-e2e-b)
declare -A want_queues=([napitap-e2e-a]=4 [napitap-e2e-b]=8) # pods.yaml: the network's 4, cni-args' 8

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
k() { kubectl --context "kind-$cluster" "$@"; }

for tool in docker kind kubectl curl go; do
	command -v "$tool" >/dev/null || fail "$tool is not on PATH"
done
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
	fail "kind cluster $cluster exists already: delete it (kind delete cluster --name $cluster) or set KIND_CLUSTER"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/napitap-kind.XXXXXX")
created=0
diagnostics() {
	say "diagnostics"
	k get nodes -o wide || true
	k get pods -A -o wide || true
	k describe pods -l app.kubernetes.io/name=napitap-e2e || true
	k -n napitap-system logs ds/napitap --all-containers --tail=100 || true
	k get events -A --sort-by=.lastTimestamp | tail -40 || true
}
cleanup() {
	local rc=$?
	trap - EXIT
	if [ "$rc" -ne 0 ] && [ "$created" = 1 ]; then diagnostics; fi
	if [ "$created" = 1 ]; then
		if [ "$keep" = 1 ]; then
			echo "keeping cluster $cluster (kind delete cluster --name $cluster)"
		else
			kind delete cluster --name "$cluster" || true
		fi
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT

say "build: napitap-verify, the reference bridge and host-local plugins, the image"
goarch=$(go env GOARCH)
CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -o "$work/" ./test/e2e/cmd/napitap-verify
# The reference plugins at the versions go.mod pins (its tool block).
mkdir -p "$work/cni"
CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -o "$work/cni/" \
	github.com/containernetworking/plugins/plugins/main/bridge \
	github.com/containernetworking/plugins/plugins/ipam/host-local
# As every other path builds it: make image, here with docker.
make image IMAGE="$image" IMAGE_BUILDER=docker VERSION=e2e

say "kind cluster $cluster"
cat >"$work/kind.yaml" <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
EOF
create=(kind create cluster --name "$cluster" --config "$work/kind.yaml" --wait 180s)
if [ -n "$node_image" ]; then create+=(--image "$node_image"); fi
created=1
"${create[@]}"
kind load docker-image "$image" --name "$cluster"
mapfile -t nodes < <(kind get nodes --name "$cluster")
for node in "${nodes[@]}"; do
	docker exec "$node" test -c /dev/net/tun || fail "$node has no /dev/net/tun (modprobe tun on the host)"
	# kind's nodes bring host-local but maybe not bridge; never replace theirs.
	for plugin in bridge host-local; do
		if ! docker exec "$node" test -x "/opt/cni/bin/$plugin"; then
			docker cp "$work/cni/$plugin" "$node:/opt/cni/bin/$plugin"
		fi
	done
	docker cp "$work/napitap-verify" "$node:/usr/local/bin/napitap-verify"
done

say "Multus $multus_version (thin)"
curl -fsSL "$multus_manifest" -o "$work/multus.yml"
# The release's manifest names the moving :snapshot image; pin it.
sed "s#multus-cni:snapshot#multus-cni:${multus_version}#g" "$work/multus.yml" >"$work/multus-pinned.yml"
if ! grep -q "multus-cni:${multus_version}" "$work/multus-pinned.yml" || grep -q ':snapshot' "$work/multus-pinned.yml"; then
	fail "could not pin the Multus image in $multus_manifest"
fi
k apply -f "$work/multus-pinned.yml"
k -n kube-system rollout status ds/kube-multus-ds --timeout="$timeout"

say "napitap: kubectl apply -k deploy/ (image $image)"
# test/e2e/kind/kustomization.yaml is deploy/ with only the image tag set.
k apply -k test/e2e/kind/
k -n napitap-system rollout status ds/napitap --timeout="$timeout"
for node in "${nodes[@]}"; do
	docker exec "$node" test -x /opt/cni/bin/napitap || fail "$node: /opt/cni/bin/napitap not installed"
	if docker exec "$node" sh -c 'ls -A /opt/cni/bin' | grep -q '^\.napitap'; then
		fail "$node: the install left a temporary file in /opt/cni/bin"
	fi
	docker exec "$node" test -S "$socket" || fail "$node: napitapd's socket $socket is missing"
done

say "two pods on napitap-bridge"
k apply -f deploy/examples/napitap-bridge.yaml
k apply -f test/e2e/kind/pods.yaml
k wait --for=condition=Ready pod -l app.kubernetes.io/name=napitap-e2e --timeout="$timeout"

# Each pod's node, sandbox ID (CNI_CONTAINERID) and netns, from the node's
# CRI runtime.
declare -A pod_node pod_id pod_netns
for pod in "${pods[@]}"; do
	node=$(k get pod "$pod" -o jsonpath='{.spec.nodeName}')
	id=$(docker exec "$node" crictl pods --namespace default --name "^${pod}\$" --state ready -q)
	if [ -z "$id" ] || [ "$(wc -w <<<"$id")" != 1 ]; then
		fail "$pod: sandbox IDs on $node: '$id'"
	fi
	netns=$(docker exec "$node" crictl inspectp -o go-template \
		--template '{{range .info.runtimeSpec.linux.namespaces}}{{if eq .type "network"}}{{.path}}{{end}}{{end}}' "$id" || true)
	if [ -z "$netns" ]; then # another runtime's layout: take the netns path from the JSON
		netns=$(docker exec "$node" crictl inspectp -o json "$id" | grep -o '"/\(var/\)\{0,1\}run/netns/[^"]*"' | head -n 1 | tr -d '"' || true)
	fi
	[ -n "$netns" ] || fail "$pod: no network namespace in crictl inspectp $id"
	pod_node[$pod]=$node pod_id[$pod]=$id pod_netns[$pod]=$netns
	echo "$pod: node $node, sandbox $id, netns $netns"
done

verify() { # verify present|gone POD
	local pod=$2 q=${want_queues[$2]}
	docker exec "${pod_node[$pod]}" napitap-verify "$1" \
		--netns "${pod_netns[$pod]}" --container "${pod_id[$pod]}" \
		--ifname net1 --tap tap1 --queues "$q" --wiring tc-redirect \
		--socket "$socket" --held "$q"
}

say "verify on the nodes: tap1 wired to net1, queues held by napitapd"
for pod in "${pods[@]}"; do
	verify present "$pod"
done

say "delete the pods; verify that nothing is left"
k delete -f test/e2e/kind/pods.yaml --wait=true --timeout="$timeout"
for pod in "${pods[@]}"; do
	# The sandbox's CNI DEL may finish just after the pod object is gone.
	for i in $(seq 30); do
		if out=$(verify gone "$pod" 2>&1); then
			echo "$out"
			break
		fi
		[ "$i" = 30 ] && fail "$pod: $out"
		sleep 2
	done
done

say "PASS"
