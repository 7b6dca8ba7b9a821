package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
)

// Whoever writes a NAD picks ipam.type. One that leads back to napitap made
// each napitap exec another, without end, until the node ran out of pids
// (issue 19). Every verb now refuses it at once, with code 7 naming
// ipam.type.
func TestAnIPAMThatLeadsBackToNapitapIsRefusedByEveryVerb(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	napitap := filepath.Join(binDir, "napitap")
	ipamDir := t.TempDir()
	if err := os.Symlink(napitap, filepath.Join(ipamDir, "napitap-alias")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ipamDir, "hands-back"), []byte("#!/bin/sh\nexec "+napitap+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, ipam string
	}{
		{"napitap itself as ipam.type", "napitap"},
		{"napitap's binary under another name", "napitap-alias"},
		{"an IPAM plugin that hands the call back to napitap", "hands-back"},
	} {
		for _, command := range []string{"ADD", "CHECK", "DEL", "STATUS", "GC"} {
			t.Run(tc.name+" is refused by "+command, func(t *testing.T) {
				conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"napitap-test","type":"napitap","ipam":{"type":%q}}`, tc.ipam)
				if command == "GC" {
					conf = strings.TrimSuffix(conf, "}") + `,"cni.dev/valid-attachments":[]}`
				}
				token := "napitap-ipamloop-" + nstest.RandomSuffix()
				start := time.Now()
				stdout, peak := runCounted(t, token, conf,
					"CNI_COMMAND="+command, "CNI_CONTAINERID="+e.ContainerID, "CNI_NETNS="+e.Pod.Path(),
					"CNI_IFNAME=tap0", "CNI_PATH="+ipamDir+":"+binDir)
				elapsed := time.Since(start).Round(time.Millisecond)
				var cniErr types.Error
				if err := json.Unmarshal(stdout, &cniErr); err != nil || cniErr.Code != types.ErrInvalidNetworkConfig || !strings.Contains(cniErr.Msg, "ipam.type: ") {
					t.Errorf("napitap wrote %.300q, want error code 7 naming ipam.type", stdout)
				}
				t.Logf("error after %v, at most %d processes: %s", elapsed, peak, cniErr.Msg)
				if left := withToken(token); len(left) != 0 {
					t.Errorf("processes %v still run", left)
				}
			})
		}
	}
}

// runCounted runs napitap with conf and env, its process tree known by
// token in the environment, and returns its stdout and the most processes
// of the tree seen at once. Whatever of the tree is left after 3 s, or at
// the end of the test, it kills: the code before grew without end.
func runCounted(t *testing.T, token, conf string, env ...string) (stdout []byte, peak int) {
	t.Helper()
	t.Cleanup(func() { killToken(token) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "napitap"))
	cmd.Env = append(append(os.Environ(), "NAPITAP_TEST_TOKEN="+token), env...)
	cmd.Stdin = strings.NewReader(conf)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Cancel = func() error { killToken(token); return nil }
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			peak = max(peak, len(withToken(token)))
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	_ = cmd.Wait() // the error is in stdout
	timedOut := ctx.Err() != nil
	cancel()
	<-done
	if timedOut {
		t.Fatalf("napitap still running after 3 s, %d processes at most", peak)
	}
	return out.Bytes(), peak
}

// withToken lists the live processes whose environment holds token.
func withToken(token string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(env, []byte("NAPITAP_TEST_TOKEN="+token+"\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killToken kills token's processes until none is left: they may still fork.
func killToken(token string) {
	for range 100 {
		pids := withToken(token)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
