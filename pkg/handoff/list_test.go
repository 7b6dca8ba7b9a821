package handoff_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// TestListPagesThroughManyAttachments: one response cannot carry the list
// of a busy node, so list comes in pages and GC still sees every one.
func TestListPagesThroughManyAttachments(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	srv, err := handoff.NewServer(filepath.Join(dir, "state"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	l, err := handoff.Listen(filepath.Join(dir, "napitapd.sock"), 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = srv.Serve(context.Background(), l); close(done) }()
	t.Cleanup(func() { l.Close(); <-done; srv.Close() })
	client := &handoff.Client{Socket: filepath.Join(dir, "napitapd.sock")}

	// Intercept attachments, each of a marked tap of its own: napitapd
	// checks the tap, and holds no fds.
	const n = 3*handoff.ListPage + 10
	pod := nstest.New(t, "handoff")
	for i := range n {
		key := handoff.Key{ContainerID: fmt.Sprintf("pod%03d", i), IfName: "net1"}
		att := &handoff.Attachment{Key: key, Network: "napitap-list", Netns: pod.Path(),
			TapName: fmt.Sprintf("napils%03d", i), Queues: 1, NAPI: true, Intercept: true}
		pod.Run(t, func() error {
			_, queues, err := tapsetup.Create(tapsetup.Spec{Name: att.TapName, Queues: 1, Flags: tapsetup.QueueFlags{NAPI: true}, Alias: tapsetup.OwnerAlias(key.ContainerID, key.IfName)})
			tapsetup.CloseQueues(queues)
			return err
		})
		if err := client.Register(att, nil); err != nil {
			t.Fatalf("register %d: %v", i, err)
		}
	}
	atts, err := client.List()
	if err != nil || len(atts) != n {
		t.Fatalf("List: %d attachments, %v; want %d", len(atts), err, n)
	}
	if released, err := client.GC("napitap-list", nil); err != nil || released != n {
		t.Errorf("GC released %d, %v; want %d", released, err, n)
	}
}

// TestListPageAsDocumented: docs/handoff-protocol.md gives runtimes in
// other languages the page size.
func TestListPageAsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "handoff-protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("at most %d attachments (`ListPage`)", handoff.ListPage)
	if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), want) {
		t.Errorf("docs/handoff-protocol.md does not say %q", want)
	}
}

// TestAKeylessFetchNeedsOneAttachmentInTheNetns: a VMM in the pod may fetch
// without a key, and napitapd picks the attachment by the caller's netns;
// with two there it cannot choose, says how many, and hands out nothing.
func TestAKeylessFetchNeedsOneAttachmentInTheNetns(t *testing.T) {
	nstest.RequireRoot(t)
	pod, d, c := newPodAndDaemon(t)
	keys := []handoff.Key{{ContainerID: "vm", IfName: "net1"}, {ContainerID: "vm", IfName: "net2"}}
	for i, key := range keys {
		tap := fmt.Sprintf("napiho%d", 8+i)
		register(t, c, attachmentFor(pod, key, "net-a", tap, 2), newTap(t, pod, tap, 2, nil, nil))
	}
	res := runPeer(t, d.socket, helperArgs{netns: pod.Path(), op: "fetch"})
	if res.Code != handoff.CodeBadRequest || !strings.Contains(res.Err, "2 attachments in the caller's netns: name one") || res.FDs != 0 {
		t.Errorf("two attachments: code %q %q with %d fds, want bad-request naming the count and no fds", res.Code, res.Err, res.FDs)
	}
	if err := c.Release(keys[1]); err != nil {
		t.Fatal(err)
	}
	res = runPeer(t, d.socket, helperArgs{netns: pod.Path(), op: "fetch"})
	if res.Code != "" || res.FDs != 2 || len(res.TapNames) != 2 || res.TapNames[0] != "napiho8" {
		t.Errorf("one attachment left: code %q %q, %d fds of %v, want the 2 queues of napiho8", res.Code, res.Err, res.FDs, res.TapNames)
	}
}
