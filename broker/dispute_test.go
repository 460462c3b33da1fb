package broker_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// uploadFull is upload with the whole reply.
func (w *worker) uploadFull(as *gpupassv1.Assignment, recs []*gpupassv1.Record) (*gpupassv1.UploadRecordsResponse, error) {
	resp, err := w.runs.Work.UploadRecords(context.Background(), connect.NewRequest(&gpupassv1.UploadRecordsRequest{
		AgentId: w.ID, AllocId: as.AllocId, FencingToken: as.FencingToken, Records: recs}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// TestDisputedRecords: a record sent at a seq the broker already holds
// with different content is refused, and the run's log says disputed
// for good, instead of the second record being dropped in silence while
// the run ends "succeeded". Two ways to get there: another node that
// learned the lease (the old attack: fences were 1, 2, 3… and agent_id
// any read token lists) writes ahead of the genuine agent, or the
// genuine agent itself sends a seq twice with different content (a bug,
// a spool that lost its tail). Once every agent call is bound to the
// node's identity (agentcall.go) the first is refused outright: nothing
// stored, nothing disputed; the second is held to the disputed bar.
func TestDisputedRecords(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		for _, forger := range []bool{true, false} {
			name := kind + "/genuine agent sends a seq twice"
			if forger {
				name = kind + "/another node writes ahead"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
				agentTok := b.Token(t, store.RoleAgent, "*")
				node := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 20))
				node.keepAlive(t)
				c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*"))
				reader := dialRuns(t, b, b.Token(t, store.RoleRead, "us-west-2"))

				run := submit(t, c, "us-west-2", nil)
				as := node.poll(t, 5)
				if as == nil || as.AllocId != run.Id {
					t.Fatalf("assignment = %v", as)
				}
				if _, err := node.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
					t.Fatal(err)
				}
				if _, err := node.upload(as, records(1, 10)); err != nil {
					t.Fatal(err)
				}
				fake := &gpupassv1.Record{Seq: 12, Kind: gpupassv1.RecordKind_RECORD_KIND_METRIC,
					Data: []byte(`{"step":12,"ts":"2026-11-29T12:00:00Z","attempt":1,"values":{"loss":0.001}}`)}
				wantDisputed := true
				if forger {
					// Another enrolled node, its own agent token, claiming
					// the genuine node's id and lease.
					other := newWorker(t, b, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-east-1", 20))
					other.ID = node.ID
					_, err := other.upload(as, []*gpupassv1.Record{fake})
					if brokertest.Code(err) != connect.CodePermissionDenied {
						t.Fatalf("another node's upload in the genuine node's name: %v, want permission_denied", err)
					}
					wantDisputed = false
				} else {
					// The genuine node, ahead of itself with other content.
					if _, err := node.upload(as, []*gpupassv1.Record{fake}); err != nil {
						t.Fatal(err)
					}
				}
				// The genuine records 11..20: seq 12 is refused when
				// another record holds it, the rest stored, and a retry
				// of the same batch goes through the same way (the agent
				// is never wedged).
				for try := range 2 {
					resp, err := node.uploadFull(as, records(11, 20))
					if err != nil {
						t.Fatalf("genuine upload, try %d: %v", try, err)
					}
					want := []uint64{12}
					if !wantDisputed {
						want = nil
					}
					if resp.HeldThrough != 20 || !cmp.Equal(resp.DisputedSeqs, want, cmpopts.EquateEmpty()) {
						t.Fatalf("genuine upload, try %d: held %d, disputed %v; want 20, %v", try, resp.HeldThrough, resp.DisputedSeqs, want)
					}
				}
				if _, err := node.update(as, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, "", 20); err != nil {
					t.Fatal(err)
				}
				got := getRun(t, reader, run.Id)
				if got.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || got.HeldThrough != 20 || got.LastSeq != 20 {
					t.Fatalf("run = %v held %d of %d", got.State, got.HeldThrough, got.LastSeq)
				}
				if wantDisputed {
					if !got.LogDisputed || got.DisputedRecords != 1 || got.FirstDisputedSeq != 12 || got.LogComplete {
						t.Errorf("GetRun: log_disputed %v, disputed_records %d, first_disputed_seq %d, log_complete %v; want true, 1, 12, false",
							got.LogDisputed, got.DisputedRecords, got.FirstDisputedSeq, got.LogComplete)
					}
				} else if got.LogDisputed || !got.LogComplete {
					t.Errorf("GetRun: log_disputed %v, log_complete %v; want an undisputed, complete log", got.LogDisputed, got.LogComplete)
				}
				list, err := reader.Run.ListRuns(context.Background(), connect.NewRequest(&gpupassv1.ListRunsRequest{}))
				if err != nil || len(list.Msg.Runs) != 1 || list.Msg.Runs[0].LogDisputed != wantDisputed {
					t.Errorf("ListRuns = %v, %v; want the run with log_disputed %v", list, err, wantDisputed)
				}
			})
		}
	}
}

// TestFencesAreRandomAndPrivate: each lease gets a random token (not 1,
// 2, 3…, which anyone could guess), a re-placement a new one, and no read
// or submit client ever sees one.
func TestFencesAreRandomAndPrivate(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	node := newWorker(t, b, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
	node.keepAlive(t)
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*"))
	reader := dialRuns(t, b, b.Token(t, store.RoleRead, "us-west-2"))
	seen := map[uint64]bool{}
	const runs = 8
	for i := range runs {
		run := submit(t, c, "us-west-2", nil)
		as := node.poll(t, 5)
		if as == nil || as.AllocId != run.Id {
			t.Fatalf("run %d: assignment = %v", i, as)
		}
		f := as.FencingToken
		// 2^-32 of drawing one this small at random; 1, 2, 3… always were.
		if f < 1<<32 || f > math.MaxInt64 {
			t.Errorf("run %d: fencing token %d is not a random 63-bit value", i, f)
		}
		for g := range seen {
			if f == g || f == g+1 || g == f+1 {
				t.Errorf("run %d: fencing token %d follows %d", i, f, g)
			}
		}
		seen[f] = true
		if run.FencingToken != 0 {
			t.Errorf("Submit shows the fencing token %d to the submitter", run.FencingToken)
		}
		if r := getRun(t, reader, run.Id); r.FencingToken != 0 {
			t.Errorf("GetRun shows the fencing token %d to a read token", r.FencingToken)
		}
		list, err := reader.Run.ListRuns(context.Background(), connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list.Msg.Runs {
			if r.FencingToken != 0 {
				t.Errorf("ListRuns shows the fencing token %d of %s to a read token", r.FencingToken, r.Id)
			}
		}
		// A wrong token is refused without telling the caller the right one.
		stale := &gpupassv1.Assignment{AllocId: as.AllocId, FencingToken: f ^ 1}
		_, err = node.update(stale, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0)
		if brokertest.Code(err) != connect.CodeFailedPrecondition || containsNumber(err.Error(), f) {
			t.Errorf("update under a wrong token: %v; want failed_precondition that does not name the lease's token", err)
		}
		if _, err := node.update(as, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, "", 0); err != nil {
			t.Fatal(err)
		}
	}
}

func containsNumber(s string, n uint64) bool {
	return strings.Contains(s, fmt.Sprint(n)) || strings.Contains(s, fmt.Sprintf("%x", n))
}
