package suite

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/test/e2e/crihelp"
)

const (
	dsNamespace  = "napitap-system"
	podNamespace = "default"
	// The socket the shipped DaemonSet serves on each node.
	napitapdSocket = "/run/napitap/napitapd.sock"
)

// kind is the cluster run.sh made: its name, kubectl and the repo.
type kind struct {
	name, kubeconfig, kubectlBin, repo string
	workers                            []string
	kernel, initrd                     string // the guest's, in vmmRef's /guest
	kubeVirtGuestLoaded                bool   // kubeVirtGuestRef built and loaded
}

var cluster *kind

func TestMain(m *testing.M) {
	if os.Getenv("NAPITAP_KIND_SUITE") != "1" {
		fmt.Fprintln(os.Stderr, "the kind suite runs inside test/e2e/kind/run.sh (make e2e-kind), which makes the cluster")
		os.Exit(1)
	}
	var err error
	cluster, err = fromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kind suite:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func fromEnv() (*kind, error) {
	k := &kind{name: os.Getenv("KIND_CLUSTER"), kubeconfig: os.Getenv("KUBECONFIG"), kubectlBin: os.Getenv("KUBECTL")}
	if k.name == "" || k.kubeconfig == "" || k.kubectlBin == "" {
		return nil, errors.New("KIND_CLUSTER, KUBECONFIG and KUBECTL must be set")
	}
	var err error
	if k.repo, err = crihelp.RepoRoot(); err != nil {
		return nil, err
	}
	out, err := k.kubectl("get", "nodes", "-l", "!node-role.kubernetes.io/control-plane", "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		return nil, err
	}
	k.workers = strings.Fields(out)
	if len(k.workers) != 2 {
		return nil, fmt.Errorf("cluster %s has workers %v, want 2", k.name, k.workers)
	}
	return k, nil
}

func (k *kind) kubectl(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(k.kubectlBin, append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func (k *kind) kubectlMust(t testing.TB, args ...string) string {
	t.Helper()
	out, err := k.kubectl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// apply applies a manifest (JSON is YAML to kubectl).
func (k *kind) apply(t testing.TB, manifest any) {
	t.Helper()
	b, err := json.Marshal(manifest)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "manifest.json")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	k.kubectlMust(t, "apply", "-f", f)
}

func jsonString(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// onNode runs a command in a kind node (a container of this machine).
func onNode(node string, args ...string) (string, error) {
	out, err := exec.Command("docker", append([]string{"exec", node}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker exec %s %s: %w: %s", node, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// sandboxOf is the pod's sandbox ID (CNI_CONTAINERID) on its node, from
// the node's CRI; "" while it has no ready one.
func sandboxOf(node, pod string) (string, error) {
	out, err := onNode(node, "crictl", "pods", "--namespace", podNamespace, "--name", "^"+pod+"$", "--state", "ready", "-q")
	if err != nil {
		return "", err
	}
	ids := strings.Fields(out)
	if len(ids) > 1 {
		return "", fmt.Errorf("pod %s has sandboxes %v on %s", pod, ids, node)
	}
	if len(ids) == 0 {
		return "", nil
	}
	return ids[0], nil
}

// netnsOf is the sandbox's netns path on its node.
func netnsOf(node, sandbox string) (string, error) {
	out, err := onNode(node, "crictl", "inspectp", "-o", "go-template", "--template",
		`{{range .info.runtimeSpec.linux.namespaces}}{{if eq .type "network"}}{{.path}}{{end}}{{end}}`, sandbox)
	if err != nil {
		return "", err
	}
	if p := strings.TrimSpace(out); p != "" {
		return p, nil
	}
	return "", fmt.Errorf("sandbox %s on %s: no network namespace in crictl inspectp", sandbox, node)
}

// waitReady waits, at most timeout in all, for the pods to be Ready, and
// gives up at once on one that failed. A terminated container is a
// failure only where nothing restarts it: a restartPolicy Always pod
// whose node came back shows its old container terminated (reason
// Unknown) until the kubelet has started the new one.
func (k *kind) waitReady(t testing.TB, timeout time.Duration, pods ...string) {
	t.Helper()
	const state = `{.spec.restartPolicy} {.status.phase} {.status.conditions[?(@.type=="Ready")].status} {.status.containerStatuses[*].state.terminated.reason}`
	err := poll(timeout, func() error {
		for _, p := range pods {
			out, err := k.kubectl("get", "pod", "-n", podNamespace, p, "-o", "jsonpath="+state)
			if err != nil {
				return err
			}
			f := strings.Fields(out)
			switch {
			case len(f) > 1 && (f[1] == "Failed" || f[1] == "Succeeded"),
				len(f) > 3 && f[0] == "Never":
				return permanent{fmt.Errorf("pod %s: %s", p, out)}
			case len(f) < 3 || f[2] != "True":
				return fmt.Errorf("pod %s: %s", p, out)
			}
		}
		return nil
	})
	if err != nil {
		describe, _ := k.kubectl(append([]string{"describe", "-n", podNamespace}, prefixed("pod/", pods)...)...)
		var logs strings.Builder
		for _, p := range pods {
			log, _ := k.kubectl("logs", "-n", podNamespace, p, "--tail=20")
			fmt.Fprintf(&logs, "--- pod %s's log:\n%s\n", p, log)
		}
		t.Fatalf("%v\n%s\n%s", err, crihelp.Tail(describe, 6000), logs.String())
	}
}

func prefixed(p string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}

// dsPod is the napitap DaemonSet's pod on node.
type dsPod struct{ name, node string }

func (k *kind) dsPodOn(node string) (dsPod, error) {
	out, err := k.kubectl("get", "pods", "-n", dsNamespace, "-l", "app.kubernetes.io/name=napitap",
		"--field-selector", "spec.nodeName="+node, "-o", "jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{\"\\n\"}{end}")
	if err != nil {
		return dsPod{}, err
	}
	var live []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 1 { // no deletionTimestamp
			live = append(live, f[0])
		}
	}
	if len(live) != 1 {
		return dsPod{}, fmt.Errorf("napitap pods on %s: %q", node, out)
	}
	return dsPod{name: live[0], node: node}, nil
}

// servingLine is napitapd's line once it serves, and whether it took
// everything over from a predecessor and how long that took.
var servingLine = regexp.MustCompile(`time=(\S+) level=INFO msg=serving .* tookOver=(true|false) took=("[^"]*"|\S*)`)

// serving is what the napitapd of ds said when it began to serve.
type serving struct {
	at       time.Time
	tookOver bool
	took     string
}

// waitServing waits for the napitapd of the DaemonSet pod on node to
// serve, and returns its pod and serving line.
func (k *kind) waitServing(node string, timeout time.Duration) (dsPod, serving, error) {
	var ds dsPod
	var s serving
	err := poll(timeout, func() error {
		var err error
		if ds, err = k.dsPodOn(node); err != nil {
			return err
		}
		log, err := k.kubectl("logs", "-n", dsNamespace, ds.name, "-c", "napitapd")
		if err != nil {
			return err
		}
		m := servingLine.FindStringSubmatch(log)
		if m == nil {
			return fmt.Errorf("pod %s's napitapd does not serve yet:\n%s", ds.name, crihelp.Tail(log, 2000))
		}
		s.at, _ = time.Parse(time.RFC3339Nano, m[1])
		s.tookOver, s.took = m[2] == "true", strings.Trim(m[3], `"`)
		return nil
	})
	return ds, s, err
}

// queue is one row of napitapctl queues -o json.
type queue struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
	FD      int    `json:"fd"`
	Tap     struct {
		NAPI bool `json:"napi"`
	} `json:"tap"`
}

// queuesOf runs napitapctl queues in the DaemonSet pod on node, as an
// operator would, for the attachment's tap.
func (k *kind) queuesOf(node, sandbox, ifName string) ([]queue, string, error) {
	ds, err := k.dsPodOn(node)
	if err != nil {
		return nil, "", err
	}
	out, err := k.kubectl("exec", "-n", dsNamespace, ds.name, "-c", "napitapd", "--",
		"napitapctl", "queues", "--container", sandbox, "--ifname", ifName, "-o", "json")
	if err != nil {
		return nil, out, err
	}
	var qs []queue
	if err := json.Unmarshal([]byte(out), &qs); err != nil {
		return nil, out, fmt.Errorf("napitapctl queues -o json: %w: %s", err, out)
	}
	return qs, out, nil
}

// attachments are napitapd's attachments on node (napitapctl list).
func (k *kind) attachments(node string) (string, error) {
	ds, err := k.dsPodOn(node)
	if err != nil {
		return "", err
	}
	return k.kubectl("exec", "-n", dsNamespace, ds.name, "-c", "napitapd", "--", "napitapctl", "list")
}

// permanent is an error poll does not wait out.
type permanent struct{ error }

// poll calls fn every second until it returns nil or a permanent error,
// or timeout has passed; it returns fn's last error. kubectl and docker
// exec are not to be called in a tight loop.
func poll(timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		var p permanent
		switch {
		case err == nil:
			return nil
		case errors.As(err, &p):
			return p.error
		case time.Now().After(deadline):
			return err
		}
		time.Sleep(time.Second)
	}
}
