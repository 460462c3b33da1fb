package broker_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// getCheckpoint reads GetCheckpoint's stream: the name and digest of its
// first message and every chunk's bytes.
func getCheckpoint(c *client.RunClients, id string) (name, sum string, data []byte, err error) {
	st, err := c.Run.GetCheckpoint(context.Background(), connect.NewRequest(&gpupassv1.GetCheckpointRequest{AllocId: id}))
	if err != nil {
		return "", "", nil, err
	}
	defer st.Close()
	for st.Receive() {
		if name == "" {
			name, sum = st.Msg().Name, st.Msg().Sha256
		}
		data = append(data, st.Msg().Data...)
	}
	return name, sum, data, st.Err()
}

// GetCheckpoint gives a read token of the run's region the newest whole
// checkpoint its node shipped, once the run ended (a checkpoint cut short
// by the end is not it); it refuses a run still running, a run that
// shipped none, and a token of another region, as every read of a run does.
func TestGetCheckpoint(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	w := newWorker(t, b, b.Token(t, store.RoleAgent, "*"), brokertest.H100("eu-central-1", 20))
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	reader := dialRuns(t, b, b.Token(t, store.RoleRead, "eu-*"))
	other := dialRuns(t, b, b.Token(t, store.RoleRead, "us-*"))

	run := submit(t, c, "eu-central-1", func(r *gpupassv1.SubmitRequest) { r.ResumeElsewhere = true })
	as := w.poll(t, 5)
	if as == nil || as.AllocId != run.Id {
		t.Fatalf("assignment = %v", as)
	}
	if _, err := w.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
		t.Fatal(err)
	}
	recs := records(1, 12)
	ckpt := func(seq uint64, data []byte) *gpupassv1.Record {
		return &gpupassv1.Record{Seq: seq, Kind: gpupassv1.RecordKind_RECORD_KIND_CHECKPOINT, Data: data}
	}
	newer := bytes.Repeat([]byte("n"), api.CheckpointChunk+5)
	nc := api.CheckpointChunks("ckpt-8.pt", newer)
	recs[3] = ckpt(4, api.CheckpointChunks("ckpt-4.pt", []byte("older"))[0])
	recs[7], recs[8] = ckpt(8, nc[0]), ckpt(9, nc[1])
	recs[11] = ckpt(12, api.CheckpointChunks("ckpt-12.pt", bytes.Repeat([]byte("c"), api.CheckpointChunk+5))[0])
	if held, err := w.upload(as, recs); err != nil || held != 12 {
		t.Fatalf("upload: %d, %v", held, err)
	}
	if _, _, _, err := getCheckpoint(reader, run.Id); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("checkpoint of a running run: %v, want failed_precondition", err)
	}
	if _, err := w.update(as, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, "exited with code 0", 12); err != nil {
		t.Fatal(err)
	}
	name, sum, data, err := getCheckpoint(reader, run.Id)
	want := sha256.Sum256(newer)
	if err != nil || name != "ckpt-8.pt" || sum != hex.EncodeToString(want[:]) || !bytes.Equal(data, newer) {
		t.Fatalf("checkpoint = %q %s (%d bytes), %v; want ckpt-8.pt, %d bytes", name, sum, len(data), err, len(newer))
	}
	if _, _, _, err := getCheckpoint(other, run.Id); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("checkpoint read with another region's token: %v, want permission_denied", err)
	}

	plain := submit(t, c, "eu-central-1", nil)
	as = w.poll(t, 5)
	if as == nil || as.AllocId != plain.Id {
		t.Fatalf("assignment = %v", as)
	}
	if _, err := w.update(as, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, "exited with code 0", 0); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := getCheckpoint(reader, plain.Id); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "shipped no checkpoint") {
		t.Errorf("checkpoint of a run that shipped none: %v, want failed_precondition saying so", err)
	}
}
