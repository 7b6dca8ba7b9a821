// Package node runs napitap on a real Kubernetes node: etcd,
// kube-apiserver, containerd (CRI), napitapd and kubelet, all in a node
// netns of the test's own ("napitap-node-*"), with pods applied through
// kubectl and asserted with test/e2e/nodecheck.
//
// kube-apiserver, kubelet, kubectl (k8s.io/kubernetes v1.37.2) and etcd
// (go.etcd.io/etcd/server/v3, the version that release pins) are built
// from the Go module proxy by build.sh through the nested wrapper module
// k8sbuild (whose dependencies never enter napitap's go.mod) and cached in
// the gitignored .cache/k8s-<version>; the first build takes minutes, a
// rerun none. Certificates, kubeconfigs and the KubeletConfiguration are
// made at test time in the temp dir.
//
// What is not a real cluster's: no scheduler, controller manager or
// kube-proxy (pods carry spec.nodeName; the test makes the namespace's
// default ServiceAccount itself), and etcd speaks plain HTTP on the node
// netns' loopback. kubelet runs in a mount namespace of its own, where
// /var/log and /var/lib are dirs of the test's (kubelet keeps its
// /var/log/containers links and its /var/lib/kubelet/device-plugins socket
// there whatever --root-dir says) and the kernel settings kubelet insists on
// (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops, ...) read as
// kubelet wants them, so that it changes no setting of the machine.
//
// TestKubernetesNode runs VM-like pods on a napitap network in "fds" mode
// (napitapd holds the queues for napitapctl exec). Its own node for
// TestVMPodsGetNAPIQueuesThroughTheSeccompAgent has an "intercept" network
// and napitap's Localhost seccomp profiles, installed by the DaemonSet's
// init-container command; QEMU (TCG) in its pods opens the tap by name,
// and GRO on the guest's traffic proves NAPI, against a RuntimeDefault
// pod.
//
// One napitap config per node: kubelet passes no per-pod CNI args (only
// Multus turns a pod's cni-args into napitap's args.cni), so the test
// gives pods different queue counts the way a CNI DaemonSet would, by
// rewriting the node's one conflist between pods and waiting until the
// CRI plugin has loaded it.
//
// Needs root, containerd 1.6, runc, nsenter, unshare and QEMU (hack/deps.sh),
// crictl (hack/crictl.sh) and the build.sh binaries, which the test builds
// if missing.
package node
