package launch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"
)

// TestServe runs batches through Serve as the bench does: stdin reaches
// the child, stdout and exit status come back, and a batch of many
// concurrent execs gets every result, reaped by the one reaper.
func TestServe(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	enc.Encode(Batch{ID: 1, Env: []string{"BASE=base"}, Runs: []Req{{Argv: []string{sh, "-c", "cat; echo \" $FOO $BASE\"; echo err >&2"}, Env: []string{"FOO=bar"}, Stdin: []byte("conf")}}})
	enc.Encode(Batch{ID: 2, Runs: []Req{{Argv: []string{sh, "-c", "exit 3"}}, {Argv: []string{"/nonexistent/plugin"}}}})
	var many []Req
	for i := range 30 {
		many = append(many, Req{Argv: []string{sh, "-c", fmt.Sprintf("sleep 0.0%d; echo %d", i%3, i)}})
	}
	enc.Encode(Batch{ID: 3, Runs: many})

	var out bytes.Buffer
	if err := Serve(&in, &out); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&out)
	var res []BatchRes
	for {
		var r BatchRes
		if err := dec.Decode(&r); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		res = append(res, r)
	}
	if len(res) != 3 {
		t.Fatalf("%d answers, want 3", len(res))
	}
	r := res[0].Results[0]
	if string(r.Stdout) != "conf bar base\n" || string(r.Stderr) != "err\n" || r.Status != 0 || r.Err != "" {
		t.Errorf("batch 1: %+v", r)
	}
	if r.Wall <= 0 || r.Wall > 10*time.Second || r.MaxRSS <= 0 {
		t.Errorf("batch 1: wall %v, maxRSS %d", r.Wall, r.MaxRSS)
	}
	if r := res[1].Results[0]; r.Status != 3 || r.Err != "" {
		t.Errorf("exit 3: %+v", r)
	}
	if r := res[1].Results[1]; r.Err == "" {
		t.Errorf("missing binary: %+v", r)
	}
	if len(res[2].Results) != 30 || res[2].Wall <= 0 {
		t.Fatalf("batch 3: %d results, wall %v", len(res[2].Results), res[2].Wall)
	}
	for i, r := range res[2].Results {
		if want := fmt.Sprintf("%d\n", i); string(r.Stdout) != want || r.Status != 0 {
			t.Errorf("batch 3 exec %d: stdout %q status %d err %q, want %q", i, r.Stdout, r.Status, r.Err, want)
		}
		if r.Wall > res[2].Wall {
			t.Errorf("batch 3 exec %d took %v, longer than the batch's %v", i, r.Wall, res[2].Wall)
		}
	}
}
