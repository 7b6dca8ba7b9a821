// Package node runs napitap on a real Kubernetes node: etcd, kube-apiserver,
// containerd (CRI), napitapd and kubelet, all in a node netns of the test's
// own ("napitap-node-*"), with pods applied through kubectl and asserted
// with test/e2e/nodecheck.
//
// kube-apiserver, kubelet, kubectl, kube-controller-manager, kube-scheduler
// (k8s.io/kubernetes v1.37.2) and etcd (go.etcd.io/etcd/server/v3, the
// version that release pins) are built from the Go module proxy by build.sh
// through the nested wrapper module k8sbuild (whose dependencies never enter
// napitap's go.mod) and cached in the gitignored .cache/k8s-<version>; the
// first build takes minutes, a rerun none. multus.sh builds the Multus thin
// plugin (v4.2.2) the same way, through multusbuild, into
// .cache/multus-<version>. Certificates, kubeconfigs and the
// KubeletConfiguration are made at test time in the temp dir.
//
// What is not a real cluster's: no kube-proxy, no scheduler or controller
// manager but on the DaemonSet's nodes, and there only the daemonset,
// garbagecollector, namespace and nodelifecycle controllers (pods carry
// spec.nodeName; the test makes the namespace's default ServiceAccount
// itself), and etcd speaks plain HTTP on the node netns' loopback. kubelet
// runs in a mount namespace of its own, where /var/log and /var/lib are dirs
// of the test's (kubelet keeps its /var/log/containers links and its
// /var/lib/kubelet/device-plugins socket there whatever --root-dir says) and
// the kernel settings kubelet insists on (vm.overcommit_memory,
// kernel.panic, kernel.panic_on_oops, ...) read as kubelet wants them, so
// that it changes no setting of the machine.
//
// TestKubernetesNode runs VM-like pods on a napitap network in "fds" mode
// (napitapd holds the queues for napitapctl exec), napitap chained in the
// node's own conflist. kubelet passes no per-pod CNI args, so it gives pods
// different queue counts the way a CNI DaemonSet would, by rewriting the
// node's one conflist between pods and waiting until the CRI plugin has
// loaded it.
//
// The other nodes run Multus as their CNI config (cluster default network:
// bridge + host-local), with the NetworkAttachmentDefinition CRD and a
// kubeconfig of Multus' own; Multus runs in a mount namespace where
// /run/napitap, /run/kata-containers/dans and /var/lib/cni are dirs of the
// test's, so that the shipped NADs, applied verbatim, reach the test's
// napitapd and leave nothing on the machine (on the DaemonSet's nodes
// /run/napitap is the machine's, which the DaemonSet's napitapd serves).
//
// The DaemonSet's nodes run napitap as a user does: make image builds the
// image, ctr imports it into the node's containerd, and kubectl apply -k
// applies deploy/ through a kustomization of the test's that sets the image
// and nothing else; kube-controller-manager (daemonset, garbagecollector,
// namespace, nodelifecycle) makes the pod and kube-scheduler places it. Its
// hostPaths are the machine's, since containerd resolves them in the
// machine's mount namespace: the test claims /opt/cni/bin/napitap,
// /var/lib/kubelet/seccomp/napitap and /run/napitap and puts back what was
// there when it ends, bind-mounts the machine's seccomp dir on the kubelet's
// (whose path kubelet names and containerd reads), links the node's napitap
// to /opt/cni/bin's, and has containerd put pod netns files in
// /var/run/netns, where the pod's napitapd sees them; it holds a read-write
// sysfs of the node netns, as a host's /sys is (the kernel keeps one sysfs
// superblock per netns, read-only if runc's /sys for the pod came first). No
// napitapd of the test's runs there: TestMultusAttachesTheShippedNetworks,
// TestVMPodsGetNAPIQueuesThroughTheSeccompAgent and
// TestTheShippedDaemonSetRunsOnTheNode all run on such nodes. The last
// checks the pod's install, privileges and socket, an fds-mode pod's queues
// through napitapctl exec, and kubectl delete -k and a fresh apply under it.
//
// TestMultusAttachesTheShippedNetworks applies deploy/examples (kubectl
// apply -k; the scheduler places its pod) and the KubeVirt and Kata NADs,
// and checks each pod's tap, cni-args and network-status.
// TestVMPodsGetNAPIQueuesThroughTheSeccompAgent attaches the KubeVirt NAD
// ("intercept") as KubeVirt's pod<hash> interface on a DaemonSet's node,
// whose pod installs napitap's Localhost seccomp profiles and serves the
// agent; QEMU (TCG, uid 107) in its pods opens the tap by name, and GRO on
// the guest's traffic proves NAPI, against a RuntimeDefault pod.
//
// TestVMsKeepNAPIQueuesThroughEveryOperatorEvent (issues 20, 26, 27)
// runs a VM pod (QEMU with QMP, its guest up all along) and fds-mode pods
// through what an operator does to a node, one event after another: a
// rollout, kill -9 of napitapd three times in a row (its supervisor starts
// it again) and of its container (the kubelet does), kill -9 of the fd
// holder, kubectl delete pod (the replacement takes over from the
// terminating pod), kubelet and containerd restarts, rollouts to an image
// that cannot be pulled and to one whose napitapd cannot start, each
// undone, an upgrade, and a rollout whose takeover a fault-hook build
// refuses (the new pod stays unready). After
// each, a NIC QEMU hot-plugs by name (netdev_add, also during the events
// that leave time to) gets NAPI queues that GRO merges on, the held
// queues are still held and fetch as NAPI queues, the fd holder holds
// napitapd's files, and pods created one every 1.5 s during the event all
// start; it prints a table of the events, which deploy/README.md carries.
// Last come the two that lose the VMs' listeners, each checked for losing
// exactly that: kubectl delete -k then apply -k, and napitapd killed with
// its fd holder (under a second VM).
//
// TestABurstOfVMPodsUnderNapitapdsCPULimits (issue 46 item 4) is opt-in:
// it runs only with NAPITAP_NODE_BURST=1, so make e2e-node (CI) skips it.
// On a DaemonSet's node it applies 50 and then 110 pods at once on the
// KubeVirt NAD, each opening its tap by name under napitap/vmm.json with
// the bench's VM opener, under the shipped CPU request and limit and
// others (kubectl patch, a rollout), and logs napitapd's throttling, its
// answer times and the pods' time to NAPI queues, which deploy/README.md
// carries; it fails only on a pod without NAPI queues or an attachment
// lost or left behind.
//
// Needs root, containerd 1.6, runc, nsenter, unshare, busybox and QEMU
// (hack/deps.sh), crictl (hack/crictl.sh) and the build.sh and multus.sh
// binaries, which the test builds if missing.
package node
