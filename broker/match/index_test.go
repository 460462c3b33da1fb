package match

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/health"
)

// TestIndexSharesReasons: a thousand nodes with the same mismatch share one
// reason, nodes with different measured values get their own, and equal
// scores order by node id.
func TestIndexSharesReasons(t *testing.T) {
	t.Parallel()
	var nodes []store.Node
	for i := 999; i >= 0; i-- { // ids in reverse: order must come from sorting
		n := node(fmt.Sprintf("n%04d", i), "us-west-2", "h100-sxm5", 8, 30, 10)
		if i%2 == 1 {
			n.Index.Runtime.CUDA = "12.2.140"
		}
		if i%10 == 1 {
			n.Index.Runtime.CUDA = "12.3.52"
		}
		nodes = append(nodes, n)
	}
	ix := Prepare(nodes, nil)
	vs := ix.Match(Query{Spec: testSpec(), Scope: []string{"*"}, MinScore: 85, Now: now, OfflineAfter: time.Minute})
	if len(vs.Candidates) != 500 || len(vs.Excluded) != 500 {
		t.Fatalf("%d candidates, %d excluded; want 500 and 500", len(vs.Candidates), len(vs.Excluded))
	}
	var measured []string
	for _, r := range vs.Reasons {
		measured = append(measured, r.Code+" "+r.Field+" "+r.Measured)
	}
	if diff := cmp.Diff([]string{"runtime_mismatch runtime.cuda 12.2.140", "runtime_mismatch runtime.cuda 12.3.52"}, measured); diff != "" {
		t.Errorf("distinct reasons (-want +got):\n%s", diff)
	}
	for _, v := range vs.Excluded {
		n := ix.Node(v.Node)
		if why := vs.Why(&v); len(why) != 1 || vs.Reasons[why[0]].Measured != n.Index.Runtime.CUDA {
			t.Fatalf("%s: reasons %v, want its own cuda %s", n.ID, why, n.Index.Runtime.CUDA)
		}
	}
	for i, v := range vs.Candidates {
		if want := fmt.Sprintf("n%04d", 2*i); ix.Node(v.Node).ID != want {
			t.Fatalf("candidate %d is %s, want %s (equal scores order by id)", i, ix.Node(v.Node).ID, want)
		}
	}
}

// TestMatchOrder: candidates by score descending, then price, then id;
// excluded in scope first, then by score descending, then id; checked
// against a comparison sort over nodes whose scores and prices tie often,
// differ in the last bits, and go negative.
func TestMatchOrder(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 1, 2, 3, 50, 3000, 3001} {
		// Odd sizes: prices far apart (most candidates at the score cap,
		// ordered by price); even: close (ordered by score).
		wide := size%2 == 1
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(size), 2))
			var nodes []store.Node
			for i := range size {
				region := "us-west-2"
				if rng.IntN(10) == 0 {
					region = "eu-west-1"
				}
				price := []float64{29, 30, 30.25, 31, 28 + 4*rng.Float64()}[rng.IntN(5)]
				if wide {
					price = []float64{10, 30, 30.25, 500, 1e-9, 40 * rng.Float64()}[rng.IntN(6)]
				}
				rtt := []float64{0, 5, 5.000000001, 49, 1e4, 60 * rng.Float64()}[rng.IntN(6)] + float64(rng.IntN(3))
				n := node(fmt.Sprintf("n%05d-%04d", rng.IntN(size*10+1), i), region, "h100-sxm5", 8, price, rtt)
				if rng.IntN(3) == 0 {
					n.Index.Runtime.CUDA = "12.2.140"
				}
				nodes = append(nodes, n)
			}
			ix := Prepare(nodes, nil)
			for range 2 { // the second match reuses the first one's buffers
				vs := ix.Match(Query{Spec: testSpec(), Scope: []string{"us-*"}, MinScore: 85, Now: now, OfflineAfter: time.Minute})
				if len(vs.Candidates)+len(vs.Excluded) != size {
					t.Fatalf("%d candidates + %d excluded, want %d", len(vs.Candidates), len(vs.Excluded), size)
				}
				id := func(v Verdict) string { return ix.Node(v.Node).ID }
				want := slices.Clone(vs.Candidates)
				slices.SortFunc(want, func(x, y Verdict) int {
					return cmpOr(-compare(x.Score, y.Score), compare(ix.Price(x.Node), ix.Price(y.Node)), strings.Compare(id(x), id(y)))
				})
				if diff := cmp.Diff(want, vs.Candidates, cmp.AllowUnexported(Verdict{})); diff != "" {
					t.Fatalf("candidates out of order (-want +got):\n%s", diff)
				}
				want = slices.Clone(vs.Excluded)
				slices.SortFunc(want, func(x, y Verdict) int {
					return cmpOr(compareBool(x.OutOfScope, y.OutOfScope), -compare(x.Score, y.Score), strings.Compare(id(x), id(y)))
				})
				if diff := cmp.Diff(want, vs.Excluded, cmp.AllowUnexported(Verdict{})); diff != "" {
					t.Fatalf("excluded out of order (-want +got):\n%s", diff)
				}
				vs.Release()
			}
		})
	}
}

func compare(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

func compareBool(x, y bool) int {
	if x == y {
		return 0
	}
	if x {
		return 1
	}
	return -1
}

func cmpOr(cs ...int) int {
	for _, c := range cs {
		if c != 0 {
			return c
		}
	}
	return 0
}

// TestVerdictReadsBack: a verdict holds its reasons and score terms by
// reference (Why, Terms); they read back what the match decided, with the
// newest beat, the spec's latency cap, and nothing for a node out of scope.
func TestVerdictReadsBack(t *testing.T) {
	t.Parallel()
	beat := now.Add(-time.Millisecond)
	fresh := node("fresh", "us-west-2", "h100-sxm5", 8, 30, 80) // its store row is older than the beat below
	capped := node("capped", "us-west-2", "h100-sxm5", 8, 30, 80)
	never := node("never", "us-west-2", "h100-sxm5", 8, 30, 0)
	never.LastSeen = time.Time{}
	gone := node("gone", "us-west-2", "h100-sxm5", 8, 30, 0)
	gone.LastSeen = now.Add(-time.Hour)
	away := node("away", "ap-south-1", "h100-sxm5", 8, 30, 0)
	ix := Prepare([]store.Node{fresh, capped, never, gone, away}, nil)
	q := Query{Spec: testSpec(), Scope: []string{"us-*"}, MinScore: 0, Now: now, OfflineAfter: time.Minute,
		Beat: func(id string) (store.Heartbeat, bool) {
			switch id {
			case "fresh":
				return store.Heartbeat{AgentID: id, At: beat, RTTMS: 5}, true
			case "gone": // older than the row: ignored
				return store.Heartbeat{AgentID: id, At: now.Add(-2 * time.Hour), RTTMS: 1}, true
			}
			return store.Heartbeat{}, false
		}}
	// The same beats given as a broker gives them: one per indexed node,
	// in index order (Live), instead of asked per node (Beat).
	live := q
	live.Beat, live.Live = nil, make([]LiveBeat, ix.Len())
	for i := range live.Live {
		if hb, ok := q.Beat(ix.ID(int32(i))); ok {
			live.Live[i] = LiveBeat{At: hb.At.UnixNano(), RTTMS: hb.RTTMS}
		}
	}
	for _, way := range []struct {
		name string
		q    Query
	}{{"beat", q}, {"live", live}} {
		t.Run(way.name, func(t *testing.T) {
			q := way.q
			vs := ix.Match(q)
			defer vs.Release()
			got := map[string]Verdict{}
			for _, v := range append(slices.Clone(vs.Candidates), vs.Excluded...) {
				got[ix.ID(v.Node)] = v
			}
			why := func(id string) []string {
				v := got[id]
				var out []string
				for _, r := range vs.Why(&v) {
					out = append(out, vs.Reasons[r].Code+" "+vs.Reasons[r].Measured)
				}
				return out
			}
			tests := []struct {
				id                    string
				online, out           bool
				lastSeen              time.Time
				rtt, usedMS, latPenal float64
				why                   []string
			}{
				{id: "fresh", online: true, lastSeen: beat, rtt: 5, usedMS: 5, latPenal: 0.5},
				{id: "capped", online: true, lastSeen: now.Add(-time.Second), rtt: 80, usedMS: 50, latPenal: 5},
				{id: "never", why: []string{"offline never"}},
				{id: "gone", lastSeen: now.Add(-time.Hour), why: []string{"offline " + now.Add(-time.Hour).Format(time.RFC3339)}},
				{id: "away", out: true, lastSeen: now.Add(-time.Second), why: []string{"region_scope ap-south-1"}},
			}
			for _, tt := range tests {
				v := got[tt.id]
				terms := vs.Terms(&v)
				if v.Online != tt.online || v.OutOfScope != tt.out || !v.LastSeenTime().Equal(tt.lastSeen) || v.RTTMS != tt.rtt {
					t.Errorf("%s: online %v, out of scope %v, last seen %v, rtt %v; want %v, %v, %v, %v",
						tt.id, v.Online, v.OutOfScope, v.LastSeenTime(), v.RTTMS, tt.online, tt.out, tt.lastSeen, tt.rtt)
				}
				if terms.Score != v.Score || terms.LatencyMS != tt.rtt*b2f(!tt.out) || terms.LatencyUsedMS != tt.usedMS || terms.LatencyPenalty != tt.latPenal {
					t.Errorf("%s: terms %+v for score %v; want the same score, latency %v used %v, penalty %v", tt.id, terms, v.Score, tt.rtt, tt.usedMS, tt.latPenal)
				}
				if diff := cmp.Diff(tt.why, why(tt.id)); diff != "" {
					t.Errorf("%s: reasons (-want +got):\n%s", tt.id, diff)
				}
			}
			if (vs.Terms(&Verdict{OutOfScope: true}) != health.Score{}) {
				t.Error("an out-of-scope verdict has score terms")
			}

		})
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
