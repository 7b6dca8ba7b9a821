package deploytest

import (
	"bytes"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/napitap/napitap/pkg/handoff"
)

// napitapdCaps are the capabilities napitapd gets, each justified in
// deploy/base/daemonset.yaml. Adding one means justifying it there and here.
var napitapdCaps = []corev1.Capability{"NET_ADMIN", "SETGID", "SETUID", "SYS_ADMIN", "SYS_PTRACE"}

// hostPaths are the host directories and devices the pod may mount, with
// their types.
var hostPaths = map[string]corev1.HostPathType{
	"/opt/cni/bin": corev1.HostPathDirectory,
	"/run/napitap": corev1.HostPathDirectoryOrCreate,
	// napitapd's state, lock and takeover socket: no other pod mounts it.
	"/run/napitapd": corev1.HostPathDirectoryOrCreate,
	// Mounted at /run/netns and /var/run/netns: the same dir on the host.
	"/run/netns":   corev1.HostPathDirectoryOrCreate,
	"/dev/net/tun": corev1.HostPathCharDev,
	// The Localhost seccomp profiles that route TUNSETIFF to napitapd.
	"/var/lib/kubelet/seccomp": corev1.HostPathDirectoryOrCreate,
}

func daemonSet(t *testing.T, dir string) (*appsv1.DaemonSet, []object) {
	t.Helper()
	objs := render(t, filepath.Join(repoRoot, dir))
	return find[*appsv1.DaemonSet](t, objs, "DaemonSet", "napitap"), objs
}

func container(t *testing.T, cs []corev1.Container, name string) *corev1.Container {
	t.Helper()
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

func TestDaemonSetPod(t *testing.T) {
	ds, objs := daemonSet(t, "deploy")
	spec := ds.Spec.Template.Spec
	// With hostNetwork a declared port is a host port, which a rollout's
	// surge pod cannot get while the old pod has it: the rollout stalls.
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		if len(c.Ports) > 0 {
			t.Errorf("container %s declares ports %+v: host ports under hostNetwork, which block a surge rollout", c.Name, c.Ports)
		}
	}

	if ds.Namespace != "napitap-system" {
		t.Errorf("namespace %q", ds.Namespace)
	}
	ns := find[*corev1.Namespace](t, objs, "Namespace", "napitap-system")
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace labels %v: the pod needs the privileged Pod Security level", ns.Labels)
	}
	sa := find[*corev1.ServiceAccount](t, objs, "ServiceAccount", spec.ServiceAccountName)
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken ||
		spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("napitapd needs no API token: automountServiceAccountToken must be false")
	}
	if !spec.HostNetwork || !spec.HostPID || spec.HostIPC {
		t.Errorf("hostNetwork %v hostPID %v hostIPC %v, want true true false", spec.HostNetwork, spec.HostPID, spec.HostIPC)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", spec.PriorityClassName)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
	}) {
		t.Errorf("tolerations %v do not tolerate every taint", spec.Tolerations)
	}
	// The new pod takes over from the old one before the old one goes.
	if s := ds.Spec.UpdateStrategy; s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil ||
		s.RollingUpdate.MaxSurge == nil || s.RollingUpdate.MaxSurge.String() != "1" ||
		s.RollingUpdate.MaxUnavailable == nil || s.RollingUpdate.MaxUnavailable.String() != "0" {
		t.Errorf("update strategy %+v, want RollingUpdate with maxSurge 1 and maxUnavailable 0", s)
	}
	if sc := spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("the pod must run with the runtime's default seccomp profile")
	}
	// container_t may not ptrace, mount or write host dirs (deploy/README.md).
	if sc := spec.SecurityContext; sc == nil || sc.SELinuxOptions == nil || *sc.SELinuxOptions != (corev1.SELinuxOptions{Type: "spc_t"}) {
		t.Error("the pod must run as SELinux type spc_t, and state nothing else of its label")
	}

	// Only the host paths napitap needs, with their types.
	volumes := map[string]string{}
	for _, v := range spec.Volumes {
		if v.Name == "fdstore" && v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory {
			continue // the fd holder's socket: this pod's alone
		}
		if v.HostPath == nil {
			t.Errorf("volume %s is not a hostPath: what is it for?", v.Name)
			continue
		}
		want, ok := hostPaths[v.HostPath.Path]
		if !ok {
			t.Errorf("volume %s mounts host path %s, which napitap does not need", v.Name, v.HostPath.Path)
		} else if v.HostPath.Type == nil || *v.HostPath.Type != want {
			t.Errorf("volume %s (%s): type %v, want %s", v.Name, v.HostPath.Path, v.HostPath.Type, want)
		}
		volumes[v.Name] = v.HostPath.Path
	}
	for p := range hostPaths {
		if !slices.Contains(slices.Collect(maps.Values(volumes)), p) {
			t.Errorf("no volume for %s", p)
		}
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, m := range c.VolumeMounts {
			prop := corev1.MountPropagationNone
			if m.MountPropagation != nil {
				prop = *m.MountPropagation
			}
			wantProp := corev1.MountPropagationNone
			if strings.HasSuffix(volumes[m.Name], "/netns") {
				// Pod netns bind mounts appear after napitapd starts.
				wantProp = corev1.MountPropagationHostToContainer
			}
			if prop != wantProp {
				t.Errorf("container %s mounts %s with propagation %s, want %s", c.Name, m.Name, prop, wantProp)
			}
		}
	}
}

func TestContainerSecurity(t *testing.T) {
	ds, _ := daemonSet(t, "deploy")
	spec := ds.Spec.Template.Spec
	if len(spec.InitContainers) != 3 || len(spec.Containers) != 1 {
		t.Fatalf("%d init containers and %d containers, want 3 (two installs and the fd holder) and 1", len(spec.InitContainers), len(spec.Containers))
	}
	header, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "base", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: no securityContext", c.Name)
			continue
		}
		if sc.Privileged == nil || *sc.Privileged {
			t.Errorf("%s: privileged must be set, to false", c.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: root filesystem not read-only", c.Name)
		}
		if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
			t.Errorf("%s: runAsUser %v, want 0", c.Name, sc.RunAsUser)
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: capabilities must drop ALL", c.Name)
		}
		if sc.SeccompProfile != nil && sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: seccomp profile %s overrides the pod's RuntimeDefault", c.Name, sc.SeccompProfile.Type)
		}
		if sc.AllowPrivilegeEscalation == nil {
			t.Errorf("%s: allowPrivilegeEscalation must be stated", c.Name)
		}
		if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
			t.Errorf("%s: resources %v: memory request and limit and a CPU request expected", c.Name, c.Resources)
		}
		if c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("%s: imagePullPolicy %q", c.Name, c.ImagePullPolicy)
		}
	}

	for _, name := range []string{"install-cni", "install-seccomp-profiles", "fdstore"} {
		c := container(t, spec.InitContainers, name)
		if sc := c.SecurityContext; len(sc.Capabilities.Add) != 0 || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: adds %v, allowPrivilegeEscalation %v: writing a file into a root-owned dir, or keeping fds sent over a socket, needs neither", name, sc.Capabilities.Add, *sc.AllowPrivilegeEscalation)
		}
	}

	// The runtime's default AppArmor profile refuses ptrace of runc and
	// Kata's shim, and mounts; the init containers need neither.
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		p := c.SecurityContext.AppArmorProfile
		want := c.Name == "napitapd"
		if got := p != nil && p.Type == corev1.AppArmorProfileTypeUnconfined; got != want {
			t.Errorf("%s: AppArmor profile %+v, unconfined %v", c.Name, p, want)
		}
	}

	napitapd := container(t, spec.Containers, "napitapd")
	add := slices.Clone(napitapd.SecurityContext.Capabilities.Add)
	slices.Sort(add)
	if !slices.Equal(add, napitapdCaps) {
		t.Errorf("napitapd adds %v, want exactly %v", add, napitapdCaps)
	}
	for _, c := range napitapdCaps {
		// Each one has its reason in the file's header comment.
		if !regexp.MustCompile(`(?m)^#\s+` + string(c) + `\s+\S`).Match(header) {
			t.Errorf("%s is not justified in the header of deploy/base/daemonset.yaml", c)
		}
	}
	if m := napitapd.Resources.Limits.Memory(); m.Value() > 64<<20 {
		t.Errorf("napitapd memory limit %s, the target is well under 64Mi", m)
	}
}

func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// napitapd serves where the plugin hands off by default, from a mounted
// host directory, and its probes ask the same socket.
func TestNapitapdPaths(t *testing.T) {
	ds, _ := daemonSet(t, "deploy")
	spec := ds.Spec.Template.Spec
	c := container(t, spec.Containers, "napitapd")
	if !slices.Equal(c.Command, []string{"/usr/local/bin/napitapd"}) {
		t.Errorf("command %v", c.Command)
	}
	socket, _ := flagValue(c.Args, "socket")
	state, _ := flagValue(c.Args, "state-dir")
	if socket != handoff.DefaultSocket || state != handoff.DefaultStateDir {
		t.Errorf("--socket %q --state-dir %q, want the plugin's defaults %q and %q", socket, state, handoff.DefaultSocket, handoff.DefaultStateDir)
	}
	if mode, _ := flagValue(c.Args, "socket-mode"); mode != "0660" {
		t.Errorf("--socket-mode %q", mode)
	}
	// An old pod's napitapd that exited after a takeover would be restarted
	// and take everything back.
	if wait, _ := flagValue(c.Args, "wait-after-takeover"); wait != "true" {
		t.Errorf("--wait-after-takeover %q, want true", wait)
	}
	// A napitapd killed by a signal is started again by its supervisor,
	// not after the kubelet's back-off.
	if supervise, _ := flagValue(c.Args, "supervise"); supervise != "true" {
		t.Errorf("--supervise %q, want true", supervise)
	}
	// A deleted pod's napitapd serves on for its replacement (fact 21),
	// within the grace period, leaving the fd holder time to stop after.
	wait, _ := flagValue(c.Args, "successor-wait")
	successorWait, err := time.ParseDuration(wait)
	grace := spec.TerminationGracePeriodSeconds
	switch {
	case err != nil || successorWait < 10*time.Second:
		t.Errorf("--successor-wait %q: want 10s or more, a replacement's start (%v)", wait, err)
	case grace == nil || time.Duration(*grace)*time.Second < successorWait+5*time.Second:
		t.Errorf("terminationGracePeriodSeconds %v: want --successor-wait (%v) and 5 s more", grace, successorWait)
	}
	mounted := func(p string) bool {
		return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return p == m.MountPath || strings.HasPrefix(p, m.MountPath+"/")
		})
	}
	// The fd holder is a sidecar (it outlives a crashed napitapd, starts
	// before it, stops after it) on a socket of this pod's alone: in a
	// rollout the old and new pod each keep their own.
	holder := container(t, spec.InitContainers, "fdstore")
	if holder.RestartPolicy == nil || *holder.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("fdstore: restartPolicy %v, want Always (a sidecar)", holder.RestartPolicy)
	}
	holderSocket, _ := flagValue(holder.Command, "socket")
	if fdstore, _ := flagValue(c.Args, "fdstore-socket"); fdstore == "" || fdstore != holderSocket {
		t.Errorf("napitapd --fdstore-socket %q, the holder serves %q", fdstore, holderSocket)
	}
	for _, who := range []*corev1.Container{c, holder} {
		if !slices.ContainsFunc(who.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "fdstore" && strings.HasPrefix(holderSocket, m.MountPath+"/")
		}) {
			t.Errorf("%s does not mount the fdstore volume where the holder's socket %s is", who.Name, holderSocket)
		}
	}
	seccompSocket, _ := flagValue(c.Args, "seccomp-socket")
	for _, p := range []string{socket, state, seccompSocket, "/run/netns", "/var/run/netns", "/dev/net/tun"} {
		if !mounted(p) {
			t.Errorf("napitapd uses %s, which no volume mounts", p)
		}
	}
	// runc dials the listener path the profiles name, from the host.
	profiles := container(t, spec.InitContainers, "install-seccomp-profiles")
	if listener, _ := flagValue(profiles.Command, "listener"); listener != seccompSocket || !strings.HasPrefix(seccompSocket, "/run/napitap/") {
		t.Errorf("profiles name listener %q, napitapd serves --seccomp-socket %q under the host's /run/napitap", listener, seccompSocket)
	}
	if dir, _ := flagValue(profiles.Command, "install"); !strings.HasPrefix(dir, "/host/kubelet-seccomp/") {
		t.Errorf("profiles installed into %q, not under the kubelet seccomp dir", dir)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.Exec == nil || !slices.Contains(p.Exec.Command, "--socket="+socket) {
			t.Errorf("probe %+v does not ask napitapd's socket", p)
		}
	}
	// Ready only once this pod's napitapd serves, not the old pod's.
	if p := c.ReadinessProbe; p == nil || p.Exec == nil || p.Exec.Command[len(p.Exec.Command)-1] != "ready" {
		t.Errorf("readiness probe %+v is not napitapctl ready", p)
	}
	// VM pods mount the sockets' dir: the state dir, with the lock and the
	// takeover socket, must be elsewhere.
	if dir := filepath.Dir(socket); state == dir || strings.HasPrefix(state, dir+"/") {
		t.Errorf("--state-dir %s is under %s, which VM pods mount for the socket", state, dir)
	}
}

// The paths the manifests expect are the ones deploy/Dockerfile makes, and
// every command and probe execs one of its binaries: the image is FROM
// scratch, with no shell to run anything else.
func TestImageLayout(t *testing.T) {
	ds, _ := daemonSet(t, "deploy")
	spec := ds.Spec.Template.Spec
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	dockerfile := string(b)
	install := container(t, spec.InitContainers, "install-cni")
	from, _ := flagValue(install.Command, "from")
	paths := map[string]string{"install-cni --from": from}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		if len(c.Command) == 0 {
			t.Errorf("%s: no command: the image's entrypoint would run", c.Name)
			continue
		}
		paths[c.Name] = c.Command[0]
		for kind, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
			if p != nil && p.Exec != nil {
				paths[c.Name+" "+kind+" probe"] = p.Exec.Command[0]
			}
		}
	}
	for what, p := range paths {
		if !copiedTo(dockerfile, p) {
			t.Errorf("%s runs %s: deploy/Dockerfile puts no binary there", what, p)
		}
	}
	if f := finalStage(dockerfile); len(f) == 0 || f[0] != "FROM scratch" {
		t.Errorf("deploy/Dockerfile's final stage starts %q, want FROM scratch", f)
	}
	for _, pkg := range []string{"./plugins/napitap", "./cmd/napitapd", "./cmd/napitapctl"} {
		if !strings.Contains(dockerfile, pkg) {
			t.Errorf("deploy/Dockerfile does not build %s", pkg)
		}
	}
	if !strings.Contains(dockerfile, "CGO_ENABLED=0") || !strings.Contains(dockerfile, "-trimpath") {
		t.Error("deploy/Dockerfile: static (CGO_ENABLED=0), -trimpath builds expected")
	}
}

// finalStage is the Dockerfile's last stage, from its FROM on, a line per
// instruction.
func finalStage(dockerfile string) []string {
	var stage []string
	for _, l := range strings.Split(dockerfile, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "FROM ") {
			stage = nil
		}
		if l != "" && !strings.HasPrefix(l, "#") {
			stage = append(stage, l)
		}
	}
	return stage
}

// copiedTo: a "COPY --from=platform /FILE ... DEST" line of the final stage
// puts FILE at p (the stage "platform" holds the target's binaries at its
// root).
func copiedTo(dockerfile, p string) bool {
	dir, file := path.Split(p)
	for _, l := range finalStage(dockerfile) {
		f := strings.Fields(l)
		if len(f) < 4 || f[0] != "COPY" || f[1] != "--from=platform" {
			continue
		}
		dst := f[len(f)-1]
		if slices.Contains(f[2:len(f)-1], "/"+file) && (dst == p || dst == dir) {
			return true
		}
	}
	return false
}

// installCommand is the install-cni init container's command and where the
// host's CNI bin dir is mounted for it.
func installCommand(t *testing.T) (argv []string, mount string) {
	t.Helper()
	ds, _ := daemonSet(t, "deploy")
	c := container(t, ds.Spec.Template.Spec.InitContainers, "install-cni")
	for _, m := range c.VolumeMounts {
		if m.Name == "cni-bin" {
			mount = m.MountPath
		}
	}
	return slices.Concat(c.Command, c.Args), mount
}

func TestInstallCommandShape(t *testing.T) {
	argv, mount := installCommand(t)
	if len(argv) < 2 || path.Base(argv[0]) != "napitapctl" || argv[1] != "install-plugin" {
		t.Fatalf("install-cni runs %q, want napitapctl install-plugin", argv)
	}
	if dir, _ := flagValue(argv, "dir"); dir == "" || dir != mount {
		t.Errorf("install-cni installs into --dir=%q, the cni-bin volume is mounted at %q", dir, mount)
	}
	// The CNI plugin's name is what the install names it after.
	if from, _ := flagValue(argv, "from"); path.Base(from) != "napitap" {
		t.Errorf("install-cni installs --from=%q, whose name is not napitap", from)
	}
}

// Run the init container's command for real, with napitapctl built from
// this tree, onto a plugin that is running: only the paths change, to a
// temporary source and CNI bin dir.
func TestInstallCommandIsAtomic(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary to stand in for a running plugin")
	}
	argv, _ := installCommand(t)
	tmp := t.TempDir()
	napitapctl := filepath.Join(tmp, "napitapctl")
	build := exec.Command(goTool(), "build", "-o", napitapctl, "./cmd/napitapctl")
	build.Dir = repoRoot
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build napitapctl: %v\n%s", err, out)
	}
	binDir := filepath.Join(tmp, "cni-bin")
	src := filepath.Join(tmp, "image", "napitap")
	for _, d := range []string{binDir, filepath.Dir(src)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	newPlugin := []byte("#!/bin/sh\necho new napitap\n")
	if err := os.WriteFile(src, newPlugin, 0o644); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(binDir, "napitap")
	if err := os.WriteFile(target, old, 0o755); err != nil {
		t.Fatal(err)
	}
	// The old plugin is running while the new one is installed.
	running := exec.Command(target, "30")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Process.Kill(); _ = running.Wait() })
	time.Sleep(50 * time.Millisecond)

	run := func(from string) ([]byte, error) {
		args := slices.Clone(argv[1:])
		for i, a := range args {
			switch {
			case strings.HasPrefix(a, "--from="):
				args[i] = "--from=" + from
			case strings.HasPrefix(a, "--dir="):
				args[i] = "--dir=" + binDir
			}
		}
		return exec.Command(napitapctl, args...).CombinedOutput()
	}
	out, err := run(src)
	if err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	t.Logf("install: %s", bytes.TrimSpace(out))
	if !bytes.Contains(out, []byte("installed "+target)) {
		t.Errorf("install does not say it installed %s: %s", target, out)
	}
	got, _ := os.ReadFile(target)
	if !bytes.Equal(got, newPlugin) {
		t.Errorf("after install, napitap holds %q", got)
	}
	if st, err := os.Stat(target); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("installed plugin: %v, mode %v, want 0755", err, st.Mode())
	}
	assertOnly(t, binDir, "napitap")
	if out, err := exec.Command(target).Output(); err != nil || string(out) != "new napitap\n" {
		t.Errorf("the installed plugin runs: %q, %v", out, err)
	}

	// A failed install leaves the installed plugin and no temporary file.
	out, err = run(filepath.Join(tmp, "missing"))
	if err == nil {
		t.Errorf("install from a missing binary succeeded:\n%s", out)
	}
	got, _ = os.ReadFile(target)
	if !bytes.Equal(got, newPlugin) {
		t.Errorf("a failed install changed the plugin")
	}
	assertOnly(t, binDir, "napitap")
}

// goTool is the go command: on PATH, or where Go's tarball puts it.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, e := range ents {
		have = append(have, e.Name())
	}
	if !slices.Equal(have, names) {
		t.Errorf("%s holds %v, want %v", dir, have, names)
	}
}
