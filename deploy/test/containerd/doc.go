// Package containerdtest decodes the Kata runtime's containerd snippets of
// deploy/kata as containerd does, with its own config types and TOML
// libraries: containerd-config.toml as 1.7 does, containerd2-config.toml as
// 2.x does. go.mod pins 1.7.35 and 2.0.14, the oldest 2.x the module proxy
// serves: later 2.x releases add keys to the CRI runtime table and drop
// none, so what 2.0 accepts, they do.
//
// A module of its own because containerd 1.7's CRI config package pulls in
// its oci package, which does not build against the runtime-spec and
// containerd API versions that Kubernetes and napitap need in deploy/test.
package containerdtest
