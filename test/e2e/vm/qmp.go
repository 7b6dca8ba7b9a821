package vm

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// QMPExecute runs one command on QEMU's QMP socket, bounded by timeout.
func QMPExecute(sock string, timeout time.Duration, command string, args any) error {
	conn, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	dec, enc := json.NewDecoder(bufio.NewReader(conn)), json.NewEncoder(conn)
	var greeting struct{ QMP json.RawMessage }
	if err := dec.Decode(&greeting); err != nil || greeting.QMP == nil {
		return fmt.Errorf("QMP greeting: %v", err)
	}
	run := func(command string, args any) error {
		req := map[string]any{"execute": command}
		if args != nil {
			req["arguments"] = args
		}
		if err := enc.Encode(req); err != nil {
			return err
		}
		for {
			var resp struct {
				Return json.RawMessage
				Error  *struct{ Class, Desc string }
				Event  string
			}
			if err := dec.Decode(&resp); err != nil {
				return fmt.Errorf("QMP %s: %w", command, err)
			}
			switch {
			case resp.Event != "":
				continue
			case resp.Error != nil:
				return fmt.Errorf("QMP %s: %s: %s", command, resp.Error.Class, resp.Error.Desc)
			}
			return nil
		}
	}
	if err := run("qmp_capabilities", nil); err != nil {
		return err
	}
	return run(command, args)
}

// TapQueuesOf lists the fds of pid that are queues attached to tap: the
// kernel's fdinfo of an attached tun fd has an "iff:\t<name>" line.
func TapQueuesOf(pid int, tap string) ([]int, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line == "iff:\t"+tap {
				fd, _ := strconv.Atoi(e.Name())
				fds = append(fds, fd)
			}
		}
	}
	slices.Sort(fds)
	return fds, nil
}
