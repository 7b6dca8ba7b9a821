#!/usr/bin/env bash
# napitap end to end on a kind cluster (make e2e-kind), offline: the
# cluster test/e2e/kind/cluster.sh creates (the node image built here,
# three nodes, privileged or through the docker wrapper), napitap's image
# (make image) and Multus v4.2.2's (test/e2e/kind/multus.sh) loaded with
# `kind load image-archive`, Multus (thin) and napitap installed as an
# operator does (the Multus DaemonSet, `kubectl apply -k`, the shipped NAD),
# then a pod on napitap-bridge on each worker, checked on its node with
# the assertions every e2e suite shares (test/e2e/nodecheck through
# napitap-verify): its tap, wiring and queues held by napitapd, then
# nothing left once it is deleted. The machine's sysctls are compared with
# those before the cluster, after the checks and after the cluster is gone.
# The cluster is deleted on exit, also on failure. Each phase's time is
# printed as it ends, and all of them at the end.
#
# Needs: root, bash 4+, docker, go, jq, debootstrap (the node image's first
# build), an image builder for make image (buildah here, or docker with
# buildx), the tun module on the host. Environment:
#   KIND_CLUSTER     cluster name (napitap-e2e); must not exist yet
#   KIND_NODE_IMAGE  the name nodeimage.sh builds the node image as
#                    (napitap.local/kind-node:<Kubernetes version>)
#   K8S_VERSION      the nodes' Kubernetes (and kubectl's), v1.37.2 unless
#                    set: another release needs its wrapper module
#                    test/e2e/node/k8sbuild-v1.MINOR (test/e2e/node/build.sh;
#                    v1.30.14 has one, README.md "Kubernetes 1.30")
#   KEEP_CLUSTER=1   keep the cluster afterwards, to look around
#   TIMEOUT          each kubectl wait (180s)
#   SUITE_RUN        go test -run for the Go suite, e.g.
#                    'Day/^VM_pods' for its first step alone
#   KUBEVIRT=0       leaves KubeVirt out; by default (1) run.sh also
#                    runs KubeVirt v1.7.0 (make kubevirt-images: built
#                    offline, loaded, installed from its operator and CR
#                    manifests with useEmulation and napitap's patch,
#                    deploy/kubevirt/kubevirt-patch.yaml), and the suite's
#                    KubeVirt tests (NAPITAP_KIND_KUBEVIRT=1) before the rest
#   KUBEVIRT_TIMEOUT the KubeVirt CR's Available condition (600s)
#   KUBEVIRT_RUN     go test -run for the KubeVirt test (^TestKubeVirt);
#                    SUITE_RUN='^TestKubeVirt' then skips the rest
set -euo pipefail

cd "$(dirname "$0")/../../.."
root=$PWD
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
export GOTOOLCHAIN=local

export KIND_CLUSTER=${KIND_CLUSTER:-napitap-e2e}
export KIND_WORKERS=2
cluster=$KIND_CLUSTER
keep=${KEEP_CLUSTER:-0}
timeout=${TIMEOUT:-180s}
kubevirt=${KUBEVIRT:-1}
kubevirt_timeout=${KUBEVIRT_TIMEOUT:-600s}
kv= # .cache/kubevirt-v1.7.0, unless KUBEVIRT=0
image=ghcr.io/napitap/napitap:e2e
socket=/run/napitap/napitapd.sock
cache=$root/.cache/kind
kind=$cache/bin/kind
kubeconfig=$cache/kubeconfig-$cluster
pods=(napitap-e2e-a napitap-e2e-b)
declare -A want_queues=([napitap-e2e-a]=4 [napitap-e2e-b]=8) # pods.yaml: the network's 4, cni-args' 8

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() {
	echo "FAIL: $*" >&2
	exit 1
}

# Phases: each one's time as it ends, all of them at exit.
t_start=$(date +%s)
phase_name= phase_t0=
phase_times=()
end_phase() {
	[ -n "$phase_name" ] || return 0
	local d=$(($(date +%s) - phase_t0))
	phase_times+=("$(printf '%-56s %4d s' "$phase_name" "$d")")
	printf -- '-- %s: %d s\n' "$phase_name" "$d"
	phase_name=
}
phase() {
	end_phase
	phase_name=$1 phase_t0=$(date +%s)
	say "$1"
}

for tool in docker go jq; do
	command -v "$tool" >/dev/null || fail "$tool is not on PATH"
done
[ -e /dev/net/tun ] || fail "no /dev/net/tun on the host (modprobe tun)"
if [ "$(id -u)" != 0 ]; then
	fail "run as root: the node image (test/e2e/kind/nodeimage.sh) is built with debootstrap and chroot"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/napitap-kind.XXXXXX")
created=0
k8s=
k() { "$k8s/kubectl" --kubeconfig "$kubeconfig" "$@"; }
diagnostics() {
	say "diagnostics"
	k get nodes -o wide || true
	k get pods -A -o wide || true
	k describe pods -l app.kubernetes.io/name=napitap-e2e || true
	k -n kube-system logs ds/kube-multus-ds --all-containers --tail=50 || true
	for p in $(k -n napitap-system get pods -o name 2>/dev/null); do
		k -n napitap-system logs "$p" --all-containers --tail=100 || true
	done
	if [ "$kubevirt" = 1 ]; then
		k get kubevirt -A -o yaml | grep -A40 '^  status:' || true
		k get vm,vmi -A -o wide || true
		for p in $(k -n kubevirt get pods -o name 2>/dev/null); do
			k -n kubevirt logs "$p" --all-containers --tail=30 || true
		done
		for p in $(k get pods -l kubevirt.io=virt-launcher -o name 2>/dev/null); do
			k describe "$p" | tail -30 || true
			k logs "$p" --all-containers --tail=50 || true
		done
	fi
	k get events -A --sort-by=.lastTimestamp | tail -40 || true
}
cleanup() {
	local rc=$?
	trap - EXIT
	end_phase
	if [ "$rc" -ne 0 ] && [ "$created" = 1 ] && [ -n "$k8s" ]; then diagnostics; fi
	if [ "$created" = 1 ]; then
		if [ "$keep" = 1 ]; then
			echo "keeping cluster $cluster (test/e2e/kind/cluster.sh delete with KIND_CLUSTER=$cluster;" \
				"kubectl --kubeconfig $kubeconfig)"
		else
			phase "delete the cluster"
			test/e2e/kind/cluster.sh delete || rc=1
			if [ -f "$cache/sysctls-$cluster.before" ]; then
				test/e2e/kind/cluster.sh sysctls || rc=1
				rm -f "$cache/sysctls-$cluster.before" "$cache/sysctls-$cluster.after"
			fi
			end_phase
		fi
	fi
	rm -rf "$work"
	say "phases ($([ "$rc" = 0 ] && echo PASS || echo "FAIL, exit $rc"))"
	printf '%s\n' "${phase_times[@]}"
	printf '%-56s %4d s\n' "total" "$(($(date +%s) - t_start))"
	exit "$rc"
}
trap cleanup EXIT

phase "build: images (node, napitap, Multus), napitap-verify"
# The node image (cached; cluster.sh would build it too) and kubectl.
test/e2e/kind/nodeimage.sh >/dev/null
k8s=$(bash test/e2e/node/build.sh --path)
[ -x "$kind" ] || fail "no $kind: make kind-node-image installs it"
if "$kind" get clusters 2>/dev/null | grep -qx "$cluster"; then
	fail "kind cluster $cluster exists already: KIND_CLUSTER=$cluster test/e2e/kind/cluster.sh delete, or set KIND_CLUSTER"
fi
goarch=$(go env GOARCH)
CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -o "$work/" ./test/e2e/cmd/napitap-verify
# The reference plugins at the versions go.mod pins, for a node image
# that lacks them (the offline one has both).
mkdir -p "$work/cni"
CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -o "$work/cni/" \
	github.com/containernetworking/plugins/plugins/main/bridge \
	github.com/containernetworking/plugins/plugins/ipam/host-local
# As every other path builds it, this machine's platform only, as an
# archive kind can load (an OCI archive from buildah or podman, docker's
# own from docker).
make image IMAGE="$image" VERSION=e2e PLATFORMS="linux/$goarch" IMAGE_ARCHIVE="$work/napitap-image.tar"
multus=$(test/e2e/kind/multus.sh)
if [ "$kubevirt" = 1 ]; then
	# Cached: only what is missing or stale is built (nice -n 19).
	kv=$(test/e2e/kind/kubevirt/images.sh)
fi

phase "cluster: cluster.sh create (3 nodes)"
created=1
env -u TIMEOUT test/e2e/kind/cluster.sh create # its TIMEOUT is in seconds: its own default
mapfile -t nodes < <("$kind" get nodes --name "$cluster" | sort)
[ "${#nodes[@]}" = 3 ] || fail "cluster $cluster has ${#nodes[@]} nodes, not 3: ${nodes[*]}"
mapfile -t workers < <(k get nodes -l '!node-role.kubernetes.io/control-plane' -o name | sed 's#^node/##' | sort)
[ "${#workers[@]}" = 2 ] || fail "cluster $cluster has ${#workers[@]} workers, not 2: ${workers[*]}"
echo "nodes: ${nodes[*]}; workers: ${workers[*]}"

phase "load images: kind load image-archive"
test/e2e/kind/cluster.sh load "$work/napitap-image.tar" "$multus/image.tar"
if [ "$kubevirt" = 1 ]; then
	test/e2e/kind/cluster.sh load "$kv"/images/*.tar
	for node in "${nodes[@]}"; do
		for c in virt-operator virt-api virt-controller virt-handler virt-launcher; do
			docker exec "$node" crictl inspecti -o go-template --template '{{.status.id}}' "quay.io/kubevirt/$c:v1.7.0" >/dev/null ||
				fail "$node: the CRI does not see quay.io/kubevirt/$c:v1.7.0 after kind load"
		done
	done
fi
for node in "${nodes[@]}"; do
	for ref in "$image" "ghcr.io/k8snetworkplumbingwg/multus-cni:v4.2.2"; do
		docker exec "$node" crictl inspecti -o go-template --template '{{.status.id}}' "$ref" >/dev/null ||
			fail "$node: the CRI does not see $ref after kind load"
	done
	echo "$node: $(docker exec "$node" crictl images | grep -E 'napitap|multus' | awk '{print $1":"$2}' | tr '\n' ' ')"
	docker exec "$node" test -c /dev/net/tun || fail "$node has no /dev/net/tun"
	# The node image has them; never replace a node's own.
	for plugin in bridge host-local; do
		if ! docker exec "$node" test -x "/opt/cni/bin/$plugin"; then
			docker cp "$work/cni/$plugin" "$node:/opt/cni/bin/$plugin"
		fi
	done
	docker cp "$work/napitap-verify" "$node:/usr/local/bin/napitap-verify"
done

phase "Multus v4.2.2 (thin): its DaemonSet"
k apply -f "$multus/multus-daemonset.yml"
k -n kube-system rollout status ds/kube-multus-ds --timeout="$timeout"
for node in "${nodes[@]}"; do
	for i in $(seq 30); do
		docker exec "$node" sh -c "ls /etc/cni/net.d/00-multus.conf*" >/dev/null 2>&1 && break
		[ "$i" = 30 ] && fail "$node: Multus wrote no /etc/cni/net.d/00-multus.conf(list)"
		sleep 2
	done
	echo "$node: $(docker exec "$node" ls /etc/cni/net.d | tr '\n' ' ')"
done

phase "napitap: kubectl apply -k test/e2e/kind/"
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
k -n napitap-system get pods -o wide

if [ "$kubevirt" = 1 ]; then
	phase "KubeVirt v1.7.0: operator, CR, emulation, napitap patch"
	# As KubeVirt's docs install it: the operator, then the CR; software
	# emulation (no usable /dev/kvm here) and napitap's binding and
	# virt-launcher profile (deploy/kubevirt/README.md, step 3) patched in.
	k apply -f "$kv/kubevirt-operator.yaml"
	k -n kubevirt rollout status deploy/virt-operator --timeout="$timeout"
	k apply -f "$kv/kubevirt-cr.yaml"
	k -n kubevirt patch kubevirt kubevirt --type merge \
		-p '{"spec":{"configuration":{"developerConfiguration":{"useEmulation":true}}}}'
	k -n kubevirt patch kubevirt kubevirt --type merge --patch-file deploy/kubevirt/kubevirt-patch.yaml
	k -n kubevirt wait kubevirt kubevirt --for condition=Available --timeout="$kubevirt_timeout"
	k -n kubevirt get kubevirt kubevirt -o jsonpath='{.status.phase} {.status.observedKubeVirtVersion}{"\n"}'
	k -n kubevirt get pods -o wide
	k -n kubevirt get kubevirt kubevirt -o jsonpath='{.spec.configuration}{"\n"}'
fi

phase "pods: napitap-bridge NAD, a pod on each worker"
k apply -f deploy/examples/napitap-bridge.yaml
k apply -f test/e2e/kind/pods.yaml
k wait --for=condition=Ready pod -l app.kubernetes.io/name=napitap-e2e --timeout="$timeout"
k get pods -l app.kubernetes.io/name=napitap-e2e -o wide

# Each pod's node, sandbox ID (CNI_CONTAINERID) and netns, from the node's
# CRI runtime.
declare -A pod_node pod_id pod_netns on_worker
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
	on_worker[$node]=$pod
	echo "$pod: node $node, sandbox $id, netns $netns"
done
for w in "${workers[@]}"; do
	[ -n "${on_worker[$w]:-}" ] || fail "no pod of the suite runs on worker $w"
done

verify() { # verify present|gone POD
	local pod=$2 q=${want_queues[$2]}
	docker exec "${pod_node[$pod]}" napitap-verify "$1" \
		--netns "${pod_netns[$pod]}" --container "${pod_id[$pod]}" \
		--ifname net1 --tap tap1 --queues "$q" --wiring tc-redirect \
		--socket "$socket" --held "$q"
}

phase "verify on both workers: tap1 wired to net1, queues held"
for pod in "${pods[@]}"; do
	echo "-- $pod on ${pod_node[$pod]}"
	verify present "$pod"
done
for pod in "${pods[@]}"; do
	node=${pod_node[$pod]}
	ds=$(k -n napitap-system get pods -l app.kubernetes.io/name=napitap \
		--field-selector "spec.nodeName=$node" -o jsonpath='{.items[0].metadata.name}')
	[ -n "$ds" ] || fail "no napitap pod on $node"
	echo "-- napitapctl queues of $pod (worker $node, from $ds):" \
		"kubectl -n napitap-system exec $ds -c napitapd -- napitapctl queues --container ${pod_id[$pod]} --ifname net1"
	out=$(k -n napitap-system exec "$ds" -c napitapd -- napitapctl queues --container "${pod_id[$pod]}" --ifname net1) ||
		fail "napitapctl queues on $node: $out"
	echo "$out"
	# Every queue of the tap, whoever holds it (napitapd, its mirror's
	# copies, the fd holder), shows NAPI in the flags, the TAP NAPI column (the rows are those starting with a pid).
	if awk '$1 ~ /^[0-9]+$/ { n++; if ($5 != "true") bad = 1 } END { exit !(n > 0 && !bad) }' <<<"$out"; then :; else
		fail "$pod: napitapctl queues lists no queue, or one without NAPI"
	fi
done
test/e2e/kind/cluster.sh sysctls

phase "delete the pods; verify that nothing is left"
k delete -f test/e2e/kind/pods.yaml --wait=true --timeout="$timeout"
for pod in "${pods[@]}"; do
	# The sandbox's CNI DEL may finish just after the pod object is gone.
	for i in $(seq 30); do
		if out=$(verify gone "$pod" 2>&1); then
			echo "-- $pod on ${pod_node[$pod]}"
			echo "$out"
			break
		fi
		[ "$i" = 30 ] && fail "$pod: $out"
		sleep 2
	done
done

if [ "$kubevirt" = 1 ]; then
	phase "suite: KubeVirt VMs on napitap networks and through an operator's day (TestKubeVirt)"
	# Before the operator's day, which drains a worker and stops the other.
	if ! NAPITAP_KIND_SUITE=1 NAPITAP_KIND_KUBEVIRT=1 KUBECONFIG="$kubeconfig" KUBECTL="$k8s/kubectl" \
		KUBEVIRT_DIR="$kv" go test -count=1 -v -timeout "${SUITE_TIMEOUT:-45m}" -run "${KUBEVIRT_RUN:-^TestKubeVirt}" ./test/e2e/kind/suite/; then
		fail "the kind suite's KubeVirt test failed (its log above)"
	fi
fi

phase "suite: VMs on both workers through an operator's day (test/e2e/kind/suite)"
# Go, from this machine: kind's nodes are its containers, their QEMUs its
# processes (test/e2e/kind/suite/doc.go).
if ! NAPITAP_KIND_SUITE=1 KUBECONFIG="$kubeconfig" KUBECTL="$k8s/kubectl" \
	go test -count=1 -v -timeout "${SUITE_TIMEOUT:-45m}" -run "${SUITE_RUN:-.}" ./test/e2e/kind/suite/; then
	fail "the kind suite failed (its log above)"
fi
end_phase
say "PASS"
