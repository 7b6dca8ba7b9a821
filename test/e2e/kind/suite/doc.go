// Package suite is the kind suite's Go half: VMs on both workers of the
// three-node kind cluster that test/e2e/kind/run.sh (make e2e-kind) made
// and installed napitap on, and what an operator does to those nodes
// while the VMs run (a DaemonSet rollout, kubectl delete -k and apply -k,
// a drain, a node lost and back). It asserts from the kernel's state:
// napitapctl queues from the DaemonSet pod, QEMU's own queue fds read
// from the host (kind's nodes are containers of this machine's kernel),
// a GRO probe on each hot-plugged queue, and the guests' pings.
//
// run.sh runs it with the cluster's coordinates in the environment
// (NAPITAP_KIND_SUITE=1, KIND_CLUSTER, KUBECONFIG, KUBECTL); on its own it
// fails, as every e2e suite here does when it cannot run.
package suite
