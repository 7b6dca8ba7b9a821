#!/bin/bash
# The pod network of napitap's offline kind nodes, in place of kind's
# kindnetd (whose image cannot be had offline): what kindnetd does for
# pods on a single Docker network, less its masquerade and network
# policies. Every few seconds, with the kubelet's own credentials, it
# reads each node's podCIDR and InternalIP; it writes this node's CNI
# config once that is known (ptp and host-local on its podCIDR, as
# kindnetd's, less portmap: the plugins module v1.10.0 lacks a go.sum line
# for go-shellwords, so portmap does not build from the module proxy), and
# keeps a route to every other node's podCIDR through that node. Run by podnet.service (test/e2e/kind/nodeimage.sh).
set -o nounset -o pipefail

kubeconfig=/etc/kubernetes/kubelet.conf
conf=/etc/cni/net.d/10-kindnet.conflist
me=$(hostname)
mtu=$(cat /sys/class/net/eth0/mtu 2>/dev/null || echo 1500)

# The node authorizer lets a kubelet read its own Node only; RBAC may grant
# more. The control plane (the only node with admin.conf) grants every node
# get and list of nodes, once.
rbac=
grant() {
	kubectl --kubeconfig /etc/kubernetes/admin.conf apply -f - >/dev/null <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "napitap-kind:podnet"}
rules: [{apiGroups: [""], resources: [nodes], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "napitap-kind:podnet"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "napitap-kind:podnet"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:nodes"}]
YAML
}

while :; do
	sleep 2
	[ -f "$kubeconfig" ] || continue
	if [ -z "$rbac" ] && [ -f /etc/kubernetes/admin.conf ]; then
		grant && rbac=1 && echo "podnet: nodes may list nodes (ClusterRole napitap-kind:podnet)"
	fi
	nodes=$(kubectl --kubeconfig "$kubeconfig" get nodes -o \
		jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}' 2>/dev/null) || continue
	while read -r name cidr ip; do
		[ -n "$cidr" ] && [ -n "$ip" ] || continue
		if [ "$name" = "$me" ]; then
			want=$(cat <<JSON
{
  "cniVersion": "1.0.0",
  "name": "kindnet",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "mtu": $mtu,
     "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state",
              "routes": [{"dst": "0.0.0.0/0"}], "ranges": [[{"subnet": "$cidr"}]]}}
  ]
}
JSON
)
			if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
				mkdir -p "${conf%/*}"
				printf '%s\n' "$want" >"$conf.tmp" && mv "$conf.tmp" "$conf"
				echo "podnet: $conf for $cidr"
			fi
		else
			case "$(ip route show "$cidr")" in
			*"via $ip "*) ;;
			*) ip route replace "$cidr" via "$ip" && echo "podnet: route $cidr via $ip ($name)" ;;
			esac
		fi
	done <<<"$nodes"
done
