package cnibench

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

const (
	modulePath    = "github.com/napitap/napitap"
	pluginsModule = "github.com/containernetworking/plugins"
)

// buildAll builds every binary the bench execs into dir, the same way for
// all of them (static, stripped, as `make build` does), and describes how.
// napitap, napitapd, napitapctl, napitap-fdstore, bridge and host-local
// come from this module (bridge and host-local from the
// upstream plugins at the version go.mod pins). The reference tap plugin is
// in the module graph but not in go.sum (it needs go-selinux), so it is
// built with `go install <pkg>@<that version>` from the Go module proxy,
// with the plugins module's own go.mod, as upstream releases it.
func buildAll(ctx context.Context, dir string) (string, error) {
	goBin := goTool()
	root, err := moduleRoot(ctx, goBin)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	env := append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	flags := []string{"-trimpath", "-ldflags=-s -w"}
	build := func(cwd string, extraEnv []string, args ...string) error {
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir, cmd.Env = cwd, append(env, extraEnv...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w", goBin, strings.Join(args, " "), err)
		}
		return nil
	}
	args := append(append([]string{"build"}, flags...), "-o", dir+"/",
		"./plugins/napitap", "./cmd/napitapd", "./cmd/napitapctl", "./cmd/napitap-fdstore", "./internal/bench/cnibench/launch/"+launcherBin,
		pluginsModule+"/plugins/main/bridge", pluginsModule+"/plugins/ipam/host-local")
	if err := build(root, nil, args...); err != nil {
		return "", err
	}
	version, err := output(ctx, root, goBin, "list", "-m", "-f", "{{.Version}}", pluginsModule)
	if err != nil {
		return "", err
	}
	tap := pluginsModule + "/plugins/main/tap@" + version
	if err := build(dir, []string{"GOBIN=" + dir}, append(append([]string{"install"}, flags...), tap)...); err != nil {
		return "", err
	}
	rev, _ := output(ctx, root, "git", "describe", "--always", "--dirty")
	if rev == "" {
		rev = "unknown revision"
	}
	return fmt.Sprintf("built by the bench, all with `CGO_ENABLED=0 go build -trimpath -ldflags='-s -w'` (%s): napitap, napitapd, napitapctl, napitap-fdstore and "+launcherBin+" at %s; "+
		"bridge and host-local from %s %s (go.mod); tap by `go install %s`", runtime.Version(), rev, pluginsModule, version, tap), nil
}

// moduleRoot is the directory of napitap's go.mod, found from the working
// directory.
func moduleRoot(ctx context.Context, goBin string) (string, error) {
	gomod, err := output(ctx, "", goBin, "env", "GOMOD")
	if err != nil {
		return "", err
	}
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the %s module: run from the repository or pass --bin", modulePath)
	}
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	if strings.TrimSpace(first) != "module "+modulePath {
		return "", fmt.Errorf("%s is not %s: run from the repository or pass --bin", gomod, modulePath)
	}
	return filepath.Dir(gomod), nil
}

// goTool is the go command: from PATH, else the toolchain that built us.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func output(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return strings.TrimSpace(string(out)), nil
}

// dynamicallyLinked names those of names in dir that the kernel starts
// through an ELF interpreter (the dynamic loader).
func dynamicallyLinked(dir string, names []string) []string {
	var dyn []string
	for _, name := range names {
		f, err := elf.Open(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				dyn = append(dyn, name)
				break
			}
		}
		f.Close()
	}
	return dyn
}
