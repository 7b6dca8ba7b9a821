// Package cri runs napitap under containerd's CRI plugin, driven by crictl
// exactly as kubelet drives it: RunPodSandbox makes the pod netns and runs
// the CNI chain (bridge + napitap, handing the queues to the test's own
// napitapd), StopPodSandbox and RemovePodSandbox tear it down. The node
// assertions are test/e2e/nodecheck's, the ones every napitap e2e asks;
// the containerd node is test/e2e/crihelp's, shared with the real-node e2e
// (test/e2e/node), where kubelet drives it.
//
// Everything (containerd's root, state, sockets and runc root, the CNI
// config and IPAM data, napitapd, the pod logs) lives in one temp dir and
// in a "node" netns of the test's own; the only things outside are the shim
// sockets containerd 1.6 always puts under /run/containerd/s and the pods'
// cgroups under a napicri-* parent, which the test removes.
//
// Needs root, containerd 1.6 and runc (hack/deps.sh), and crictl, which
// hack/crictl.sh builds into the gitignored .cache/bin on first use.
package cri
