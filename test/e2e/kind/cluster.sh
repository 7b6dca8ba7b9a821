#!/usr/bin/env bash
# A kind cluster of napitap's offline node image (test/e2e/kind/nodeimage.sh),
# on whatever Docker engine is here, privileged or not:
#
#   cluster.sh create   build the image if needed, pick the mode, create the
#                       cluster, wait for every node to be Ready, and check
#                       that the machine's kernel settings did not change
#   cluster.sh delete   delete it (kind delete cluster)
#   cluster.sh load ARCHIVE...
#                       kind load image-archive into every node, in the
#                       mode create picked (kind runs `docker exec
#                       --privileged` there too)
#   cluster.sh sysctls  compare the machine's kernel settings with those
#                       create recorded before it started the cluster
#
# The mode: a tiny offline image (a static binary, `docker import`ed) is
# started with --privileged. Where it starts, kind runs unmodified. Where
# it fails with runc's "unable to apply caps" (a capability bounding set
# without CAP_SYS_RESOURCE, as on the go-docker machines), kind runs with
# test/e2e/kind/docker first on its PATH, which rewrites --privileged into
# an explicit set (docs/DESIGN.md facts 26 and 29). Any other failure stops.
#
# Environment: KIND_CLUSTER (napitap-kind), KIND_WORKERS (0: one node, the
# control plane; 2 for three nodes), KIND_NODE_IMAGE, TIMEOUT (a wait, 300 s),
# K8S_VERSION (the node image's Kubernetes, test/e2e/node/build.sh: v1.37.2
# unless set; before 1.31 the config turns kube-proxy's NFTablesProxyMode
# gate on and leaves out the kubelet's failCgroupV1).
# The cluster's kubeconfig is .cache/kind/kubeconfig-<cluster>.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cache=$root/.cache/kind
cluster=${KIND_CLUSTER:-napitap-kind}
workers=${KIND_WORKERS:-0}
timeout=${TIMEOUT:-300}
kubeconfig=$cache/kubeconfig-$cluster
# A Docker network of the cluster's own, which delete removes (kind never
# removes its shared "kind" network).
export KIND_EXPERIMENTAL_DOCKER_NETWORK=$cluster
kind=$cache/bin/kind
say() { printf '\n== %s\n' "$*" >&2; }
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0)) s"; }

# The machine-wide sysctls, less those that count things as they change.
host_sysctls() {
	sysctl -a 2>/dev/null | grep -E '^(kernel|vm|fs|user|abi|debug|dev)\.' |
		grep -vE '^(kernel\.random\.|kernel\.ns_last_pid|kernel\.pty\.nr|fs\.(dentry-state|file-nr|inode-nr|inode-state|quota\.)|kernel\.sched_domain|vm\.stat_refresh|fs\.aio-nr|kernel\.tainted|kernel\.keys\.(maxkeys|maxbytes)|kernel\.core_pattern|dev\.cdrom)' |
		sort
}

# Compares the machine's sysctls with those recorded before create.
check_sysctls() {
	host_sysctls >"$cache/sysctls-$cluster.after"
	for s in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes; do
		echo "$s: before $(grep "^$s = " "$cache/sysctls-$cluster.before" | cut -d' ' -f3), now $(sysctl -n "$s")" >&2
	done
	if ! diff "$cache/sysctls-$cluster.before" "$cache/sysctls-$cluster.after" >&2; then
		echo "FAIL: the machine's sysctls changed" >&2
		return 1
	fi
	echo "$(wc -l <"$cache/sysctls-$cluster.after") machine-wide sysctls unchanged" >&2
}

case ${1:-} in
delete)
	"$kind" delete cluster --name "$cluster" --kubeconfig "$kubeconfig"
	if docker network inspect "$cluster" >/dev/null 2>&1; then docker network rm "$cluster" >/dev/null; fi
	rm -f "$cache/mode-$cluster"
	exit
	;;
load)
	shift
	mode=$(cat "$cache/mode-$cluster" 2>/dev/null) || { echo "cluster.sh load: no cluster $cluster made by cluster.sh create" >&2; exit 1; }
	if [ "$mode" = wrapper ]; then PATH=$here:$PATH; fi
	for a in "$@"; do
		l0=$(date +%s)
		"$kind" load image-archive --name "$cluster" "$a"
		echo "kind load image-archive $a ($(du -h "$a" | cut -f1), mode $mode): $(($(date +%s) - l0)) s" >&2
	done
	exit
	;;
sysctls)
	[ -f "$cache/sysctls-$cluster.before" ] || { echo "cluster.sh sysctls: create recorded none for $cluster" >&2; exit 1; }
	say "the machine's kernel settings (recorded before the cluster started)"
	check_sysctls
	exit
	;;
create) ;;
*)
	echo "usage: $0 create|delete|load ARCHIVE...|sysctls" >&2
	exit 2
	;;
esac

image=$("$here/nodeimage.sh")
k8s=$(bash "$root/test/e2e/node/build.sh" --path)
# The node image's Kubernetes minor (K8S_VERSION, as build.sh reads it).
k8s_minor=${k8s##*/k8s-v1.}
k8s_minor=${k8s_minor%%.*}
kubectl() { "$k8s/kubectl" --kubeconfig "$kubeconfig" "$@"; }

say "mode: does docker run --privileged start here?"
probe=napitap.local/kind-probe:latest
if ! docker image inspect "$probe" >/dev/null 2>&1; then
	d=$(mktemp -d)
	cp "$cache/bin/pause" "$d/pause"
	tar -C "$d" -c . | docker import --change 'ENTRYPOINT ["/pause"]' - "$probe" >/dev/null
	rm -rf "$d"
fi
probe_name=napitap-kind-probe-$$
if err=$(docker run -d --name "$probe_name" --privileged "$probe" 2>&1 >/dev/null); then
	docker rm -f "$probe_name" >/dev/null
	mode=privileged
	echo "mode: privileged (docker run --privileged starts here): kind runs unmodified" >&2
else
	docker rm -f "$probe_name" >/dev/null 2>&1 || true
	case $err in
	*"unable to apply caps"*)
		mode=wrapper
		echo "mode: wrapper: docker run --privileged fails here ($(echo "$err" | head -1); this machine's" \
			"CapBnd $(awk '/^CapBnd:/ {print $2}' /proc/self/status)): kind runs with test/e2e/kind/docker first on PATH" >&2
		PATH=$here:$PATH
		;;
	*)
		echo "docker run --privileged fails for another reason: $err" >&2
		exit 1
		;;
	esac
fi

host_sysctls >"$cache/sysctls-$cluster.before"
echo "$mode" >"$cache/mode-$cluster"

config=$cache/kind-$cluster.yaml
{
	cat <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  # kindnetd's image cannot be had offline: the node image's podnet.service
  # writes each node's CNI config and the routes between nodes.
  disableDefaultCNI: true
  # kube-proxy's image holds Debian's nft, not iptables.
  kubeProxyMode: nftables
EOF
	# nftables mode is alpha before 1.31, behind its gate (kind sets every
	# component's, kube-proxy's too).
	if ((k8s_minor < 31)); then printf 'featureGates:\n  NFTablesProxyMode: true\n'; fi
	cat <<EOF
nodes:
- role: control-plane
EOF
	for ((i = 0; i < workers; i++)); do echo "- role: worker"; done
	cat <<EOF
containerdConfigPatches:
# No negative oom_score_adj without CAP_SYS_RESOURCE (kind's own setting in
# a user namespace).
- |-
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
kubeadmConfigPatches:
# etcd is the version Kubernetes' module graph pins, tagged as such.
- |
  kind: ClusterConfiguration
  etcd:
    local:
      imageTag: "$(docker image inspect -f '{{index .Config.Labels "napitap.kind.etcd-tag"}}' "$image")"
# cgroup v1 (Kubernetes 1.35 and later refuse it unless told); the kubelet's
# own oom_score_adj as it is (-999 needs CAP_SYS_RESOURCE: "Failed to ensure
# process in container with oom score", every 5 minutes).
- |
  kind: KubeletConfiguration
EOF
	# failCgroupV1 is 1.31's.
	if ((k8s_minor >= 31)); then echo "  failCgroupV1: false"; fi
	echo "  oomScoreAdj: 0"
} >"$config"

# kind's entrypoint picks fuse-overlayfs when the node's root is on FUSE (as
# under Docker's fuse-overlayfs storage); containerd's store is on the /var
# volume, where overlayfs works, and Debian has no fuse-overlayfs snapshotter.
export KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER=overlayfs
say "kind create cluster --name $cluster ($((workers + 1)) nodes, $image, mode $mode)"
c0=$(date +%s)
"$kind" create cluster --name "$cluster" --image "$image" --config "$config" --kubeconfig "$kubeconfig" --retain -v 1
echo "kind create cluster: $(($(date +%s) - c0)) s" >&2

say "waiting for $((workers + 1)) Ready nodes"
w0=$(date +%s)
kubectl wait --for=condition=Ready node --all --timeout="${timeout}s"
echo "nodes Ready $(($(date +%s) - w0)) s after kind returned" >&2
kubectl get nodes -o wide

say "the machine's kernel settings"
check_sysctls
echo "cluster $cluster ready in $(elapsed) (kubectl --kubeconfig $kubeconfig)" >&2
