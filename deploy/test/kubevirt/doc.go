// Package kubevirttest decodes the KubeVirt manifests of deploy/ strictly
// into kubevirt.io/api's own Go types, and checks that the example fits
// together: the VMI's binding is registered as a tap binding, its network is
// a napitap network that the VMI's libvirt can open, and the KubeVirt CR
// selects the profile the DaemonSet installs.
//
// A module of its own, run against two versions of kubevirt.io/api: go.mod
// pins the newest release, oldest.mod the oldest the KubeVirt README claims
// (v1.1.1, the first with domainAttachmentType). One go.mod cannot hold two
// versions of one module, so the same test runs under each:
//
//	go test ./... && go test -modfile=oldest.mod ./...
package kubevirttest
