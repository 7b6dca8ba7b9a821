package handoff

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// FuzzDecodeRequest: whatever a peer sends, decodeRequest does not panic,
// answers exactly one of a request or a bad-request error, and a request it
// lets through is one napitapd can act on safely: a known op, the fields
// that op needs, keys that name a file inside the state dir, and the same
// verdict when decoded again.
func FuzzDecodeRequest(f *testing.F) {
	for _, seed := range []string{
		`{"version":1,"op":"list"}`,
		`{"version":1,"op":"fetch"}`,
		`{"version":1,"op":"fetch","key":{"containerID":"abc","ifName":"net1"}}`,
		`{"version":1,"op":"release","key":{"containerID":"abc","ifName":"net1"}}`,
		`{"version":1,"op":"release"}`,
		`{"version":1,"op":"gc","network":"net-a","valid":[{"containerID":"abc","ifName":"net1"},{"containerID":"def","ifName":"eth0"}]}`,
		`{"version":1,"op":"gc"}`,
		`{"version":1,"op":"register","attachment":{"containerID":"abc","ifName":"net1","network":"net-a","netns":"/run/netns/x","tapName":"tap1","queues":4,"multiQueue":true,"napi":true,"vnetHdr":true,"vnetHdrSize":12,"owner":107,"group":107}}`,
		`{"version":1,"op":"register","attachment":{"containerID":"abc","ifName":"net1","netns":"/run/netns/x","tapName":"tap1","queues":2}}`,
		`{"version":1,"op":"register","attachment":{"containerID":"abc","ifName":"net1","netns":"x","tapName":"tap1","queues":1}}`,
		`{"version":1,"op":"register","attachment":{"containerID":"../..","ifName":"..","netns":"/","tapName":"a/b","queues":1}}`,
		`{"version":1,"op":"register","attachment":{"containerID":"abc","ifName":"net1","netns":"/x","tapName":"tap1","queues":257,"multiQueue":true}}`,
		`{"version":1,"op":"register"}`,
		`{"version":1,"op":"fetch","key":{"containerID":"a:b","ifName":"net1"}}`,
		`{"version":1,"op":"fetch","key":{"containerID":"abc","ifName":"."}}`,
		`{"version":1,"op":"fetch","key":{"containerID":"abc","ifName":"a\u0000b"}}`,
		`{"version":2,"op":"list"}`,
		`{"op":"list"}`,
		`{"version":1,"op":"steal"}`,
		`{"version":1,"OP":"LIST"}`,
		`{"version":1e400,"op":"list"}`,
		`{"version":1,"op":"list"}{}`,
		`null`, `[]`, `"list"`, `1`, ``, `{`, "\xff\xfe\x00garbage",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, perr := decodeRequest(b)
		if (req == nil) == (perr == nil) {
			t.Fatalf("decodeRequest(%q) = %+v, %v: want exactly one", b, req, perr)
		}
		if perr != nil {
			if perr.Code != CodeBadRequest {
				t.Fatalf("decodeRequest(%q): code %q, want %q", b, perr.Code, CodeBadRequest)
			}
			return
		}
		if req.Version != Version {
			t.Fatalf("decodeRequest(%q) let version %d through", b, req.Version)
		}
		var keys []Key
		switch req.Op {
		case OpRegister:
			if req.Attachment == nil {
				t.Fatalf("decodeRequest(%q): register without attachment", b)
			}
			if err := req.Attachment.Validate(); err != nil {
				t.Fatalf("decodeRequest(%q): invalid attachment let through: %v", b, err)
			}
			keys = append(keys, req.Attachment.Key)
		case OpRelease:
			if req.Key == nil {
				t.Fatalf("decodeRequest(%q): release without key", b)
			}
			keys = append(keys, *req.Key)
		case OpFetch:
			if req.Key != nil {
				keys = append(keys, *req.Key)
			}
		case OpGC:
			keys = append(keys, req.Valid...)
		case OpList:
		default:
			t.Fatalf("decodeRequest(%q) let op %q through", b, req.Op)
		}
		s := &Server{stateDir: "/run/napitap/state"}
		for _, k := range keys {
			if err := k.Validate(); err != nil {
				t.Fatalf("decodeRequest(%q): invalid key %q let through: %v", b, k, err)
			}
			p := s.statePath(k)
			if filepath.Dir(p) != s.stateDir || filepath.Base(p) != k.ContainerID+":"+k.IfName+".json" {
				t.Fatalf("decodeRequest(%q): key %q names state file %q outside %s", b, k, p, s.stateDir)
			}
		}
		// What napitapd accepted it accepts again after a round trip.
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("marshal %+v: %v", req, err)
		}
		if _, perr := decodeRequest(again); perr != nil {
			t.Fatalf("decodeRequest(%q) accepted, its re-encoding %q refused: %v", b, again, perr)
		}
	})
}
