package broker_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/sqlite"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestFullStoreKeepsNodesOnline puts the broker's SQLite file on a small
// tmpfs and fills it: heartbeats can no longer be written. Nodes that
// keep beating stay online (and no "missed heartbeats" is logged),
// /healthz answers 503 saying the store is full, a write from a client is
// refused as "broker store full"; once space is freed the buffered beats
// are flushed and what was stored before reads back unchanged.
func TestFullStoreKeepsNodesOnline(t *testing.T) {
	testutil.NeedRoot(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", dir).CombinedOutput(); err != nil {
		testutil.Missing(t, "a tmpfs mount for a full filesystem (mount -t tmpfs, as root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	ctx := context.Background()
	logs := &testutil.Buffer{}
	cfg := brokertest.Fast()
	cfg.HeartbeatInterval, cfg.OfflineAfter = 200*time.Millisecond, time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(logs, tlog{t}), &slog.HandlerOptions{Level: slog.LevelInfo}))
	db := brokertest.DB{Kind: "sqlite", Path: filepath.Join(dir, "broker.db")}
	b := brokertest.Start(t, db, cfg)
	agentTok := b.Token(t, store.RoleAgent, "*")
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	reader := b.Clients(t, b.Token(t, store.RoleRead, "*"))
	w1 := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 20))
	w2 := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 20.5))
	w1.keepAlive(t)
	w2.keepAlive(t)

	// Stored before the disk fills: a run and its records.
	run := submit(t, c, "us-west-2", nil)
	as := w1.poll(t, 5)
	if _, err := w1.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
		t.Fatal(err)
	}
	sent := records(1, 60)
	if held, err := w1.upload(as, sent); err != nil || held != 60 {
		t.Fatalf("upload before the disk filled: %d, %v", held, err)
	}

	health := func() (int, string) {
		resp, err := http.Get(b.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	if code, body := health(); code != http.StatusOK {
		t.Fatalf("/healthz before the disk filled = %d %q", code, body)
	}

	// Fill the filesystem.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for i := 0; i < 1000; i++ { // 6 MiB is under 100 chunks
		if _, err = f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling %s: %v, want ENOSPC", dir, err)
	}
	filledAt := time.Now()

	// The flush now fails: /healthz says why (bounded wait).
	var code int
	var body string
	for i := 0; i < 100; i++ {
		if code, body = health(); code == http.StatusServiceUnavailable {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "store not writable: broker store full") {
		t.Errorf("/healthz on a full disk = %d %q; want 503 saying the store is full", code, body)
	}
	// A client's write is refused as such.
	if _, err := c.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t),
		Region: "us-west-2", Command: []string{"python3", "train.py"}})); connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "broker store full") {
		t.Errorf("Submit on a full disk: %v; want unavailable: ... broker store full", err)
	}
	// Three offline windows pass with the nodes beating: still online.
	for time.Since(filledAt) < 3*cfg.OfflineAfter {
		time.Sleep(100 * time.Millisecond)
	}
	resp, err := reader.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
	if err != nil {
		t.Fatalf("ListNodes on a full disk: %v", err)
	}
	for _, n := range resp.Msg.Nodes {
		if !n.Online {
			t.Errorf("node %s listed offline while it kept beating on a full disk", n.Id)
		}
	}
	if len(resp.Msg.Nodes) != 2 {
		t.Errorf("ListNodes = %d nodes, want 2", len(resp.Msg.Nodes))
	}
	if code, _ := health(); code != http.StatusServiceUnavailable {
		t.Errorf("/healthz = %d while the disk was still full", code)
	}

	// Free the space: the flush resumes and the beats reach the store.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freedAt := time.Now()
	for i := 0; i < 100; i++ {
		if code, body = health(); code == http.StatusOK {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != http.StatusOK {
		t.Fatalf("/healthz after space was freed = %d %q; want 200", code, body)
	}
	var nodes []store.Node
	for i := 0; i < 100; i++ {
		if nodes, err = b.Store.Nodes(ctx); err != nil {
			t.Fatal(err)
		}
		if len(nodes) == 2 && nodes[0].LastSeen.After(freedAt) && nodes[1].LastSeen.After(freedAt) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, n := range nodes {
		if !n.LastSeen.After(freedAt) {
			t.Errorf("node %s: stored last seen %s, not after space was freed (%s): the flush did not resume", n.ID, n.LastSeen, freedAt)
		}
	}
	if logged := logs.String(); strings.Contains(logged, "missed heartbeats") {
		i := strings.Index(logged, "missed heartbeats")
		t.Errorf("the broker logged a beating node offline: ...%s", logged[max(0, i-200):i+len("missed heartbeats")])
	}

	// What was stored before reads back unchanged, through a new handle.
	again, err := sqlite.Open(ctx, db.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	got, err := again.Records(ctx, run.Id, 0, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var want []store.RunRecord
	for _, r := range sent {
		want = append(want, store.RunRecord{Seq: r.Seq, Kind: store.RecordKind(r.Kind), Data: r.Data})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records stored before the disk filled (-want +got):\n%s", diff)
	}
	if a, err := again.Alloc(ctx, run.Id); err != nil || a.HeldThrough != 60 || a.State != store.AllocRunning {
		t.Errorf("run after recovery: %+v, %v", a, err)
	}
	// Writes work again.
	if held, err := w1.upload(as, records(61, 70)); err != nil || held != 70 {
		t.Errorf("upload after recovery: %d, %v", held, err)
	}
}

// tlog writes the broker's log to the test log.
type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
