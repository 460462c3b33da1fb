package broker_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// GetLogs with metrics sends a checkpoint chunk's header line only, and
// must not read the chunk into the broker's heap either: a call over this
// test's 32 MiB checkpoint must allocate under 8 MiB (one that read the
// chunks would allocate at least their 32 MiB). What the database reads
// on its side is not measured here.
//
// Not parallel: TotalAlloc counts the whole process, and top-level tests
// that do not call t.Parallel run alone.
func TestGetLogsDoesNotLoadCheckpoints(t *testing.T) {
	const chunks = 32 // of api.CheckpointChunk (1 MiB) each
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
			w := newWorker(t, b, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*"))
			run := submit(t, c, "us-west-2", nil)
			as := w.poll(t, 5)
			if as == nil || as.AllocId != run.Id {
				t.Fatalf("assignment = %v", as)
			}
			// Stored as UploadRecords stores them, without the RPCs.
			rs := b.Store.(store.Runs)
			body := make([]byte, api.CheckpointChunk)
			var seq uint64
			for off := 0; off < chunks; off += 4 {
				var batch []store.RunRecord
				for i := off; i < off+4; i++ {
					seq++
					hdr := fmt.Sprintf(`{"name":"model.pt","size":%d,"sha256":"00","offset":%d}`, chunks*api.CheckpointChunk, i*api.CheckpointChunk)
					batch = append(batch, store.RunRecord{Seq: seq, Kind: store.RecordCheckpoint, Data: append([]byte(hdr+"\n"), body...)})
				}
				if _, err := rs.AppendRecords(ctx, run.Id, as.FencingToken, batch); err != nil {
					t.Fatal(err)
				}
			}
			seq++
			if _, err := rs.AppendRecords(ctx, run.Id, as.FencingToken, []store.RunRecord{{Seq: seq, Kind: store.RecordEvent, Data: []byte(`{"msg":"saved"}`)}}); err != nil {
				t.Fatal(err)
			}
			body = nil

			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			st, err := c.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, IncludeMetrics: true}))
			if err != nil {
				t.Fatal(err)
			}
			var n, sent int
			for st.Receive() {
				for _, r := range st.Msg().Records {
					n++
					sent += len(r.Data)
					if r.Kind == gpupassv1.RecordKind_RECORD_KIND_CHECKPOINT && (len(r.Data) == 0 || r.Data[len(r.Data)-1] != '}') {
						t.Fatalf("checkpoint record %d sent as %d bytes, want its header line", r.Seq, len(r.Data))
					}
				}
			}
			if err := st.Err(); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			if n != int(seq) || sent > 16<<10 {
				t.Errorf("GetLogs sent %d records, %d bytes; want %d records, header lines only", n, sent, seq)
			}
			// Far above what headers and a page of rows take, far below
			// the chunks themselves.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
				t.Errorf("GetLogs over a %d MiB checkpoint allocated %d MiB, want under 8 MiB", chunks, alloc>>20)
			}
		})
	}
}
