package gpupass_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
)

// Issue #32, item 2: a run no node can take fails with every exclusion
// dry-run names, not the first reason of the first few nodes. Four nodes
// of one region miss the spec for four reasons, one of them for two at
// once; train's failure and the runs listing name each reason, with the
// nodes it excludes, and nothing of the other region's node.
func TestUnplaceableRunNamesEveryExclusion(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	agentTok := b.Token(t, store.RoleAgent, "*")
	torch := brokertest.H100("us-west-2", 20)
	torch.PyTorch = "2.1.2+cu121"
	small := brokertest.H100("us-west-2", 20)
	small.FreeGB = 1000
	old := brokertest.H100("us-west-2", 20)
	old.Python, old.CUDA = "3.11.4", "12.2.140"
	ids := map[string]string{}
	for name, n := range map[string]brokertest.NodeSpec{"torch": torch, "torch2": torch, "small": small, "old": old} {
		ids[name] = brokertest.Register(t, b.URL, agentTok, n).ID
	}
	elsewhere := brokertest.Register(t, b.URL, agentTok, brokertest.H100("eu-central-1", 20)).ID
	broker := []string{"--broker-url", b.URL, "--broker-token", b.Token(t, store.RoleSubmit, "*")}
	spec := writeH100Spec(t)

	// What dry-run names for the region: every reason of every node.
	code, out, errOut := runMain(t, append([]string{"validate", "--spec", spec, "--dry-run", "--all", "--min-health-score", "0", "--region", "us-west-2", "-o", "json"}, broker...)...)
	var dry struct {
		DryRun struct {
			Excluded []struct {
				Node    struct{ ID string }
				Reasons []struct{ Message string }
			}
		} `json:"dry_run"`
	}
	if err := json.Unmarshal([]byte(out), &dry); err != nil || len(dry.DryRun.Excluded) != 5 {
		t.Fatalf("dry-run: exit %d, %v, want 5 excluded:\n%s\n%s", code, err, out, errOut)
	}
	want := map[string]bool{}
	for _, x := range dry.DryRun.Excluded {
		if x.Node.ID == elsewhere {
			continue // outside the region asked for
		}
		for _, r := range x.Reasons {
			want[r.Message] = true
		}
	}
	if len(want) != 4 {
		t.Fatalf("dry-run names %d distinct reasons, want 4: %v", len(want), want)
	}

	code, out, errOut = runMain(t, append(append([]string{"train", "--spec", spec, "--no-workdir", "--min-health-score", "0", "--region", "us-west-2", "--follow"}, broker...), "--", "true")...)
	if code == 0 {
		t.Fatalf("train of an unplaceable spec: exit 0\n%s", out)
	}
	trained := out + errOut
	code, listed, errOut := runMain(t, append([]string{"runs"}, broker...)...)
	if code != 0 {
		t.Fatalf("runs: exit %d: %s", code, errOut)
	}
	for where, got := range map[string]string{"train": trained, "runs": listed} {
		for msg := range want {
			if !strings.Contains(got, msg) {
				t.Errorf("%s does not name the exclusion %q that dry-run names:\n%s", where, msg, got)
			}
		}
		if !strings.Contains(got, "2 nodes: ") || !strings.Contains(got, "4 node(s) excluded") {
			t.Errorf("%s does not say how many nodes each reason excludes:\n%s", where, got)
		}
		if strings.Contains(got, elsewhere) {
			t.Errorf("%s names %s, a node of another region:\n%s", where, elsewhere, got)
		}
	}
	for name, id := range ids {
		if !strings.Contains(trained, id) {
			t.Errorf("train's reason does not name node %s (%s):\n%s", id, name, trained)
		}
	}

	// train names the command that lists every node's reason (the
	// broker's reason names none: a server does not know the client's
	// flags), and it runs as printed; the broker comes from the flags
	// here, from the project's config for a user.
	hint := "gpupass validate --dry-run --spec " + spec + " --region us-west-2 --excluded summary"
	if !strings.Contains(trained, "(every node's reason: "+hint+")") {
		t.Fatalf("train does not name %q:\n%s", hint, trained)
	}
	if strings.Contains(listed, "gpupass validate") {
		t.Errorf("the broker's stored reason names a client command:\n%s", listed)
	}
	code, out, errOut = runMain(t, append(strings.Fields(strings.TrimPrefix(hint, "gpupass ")), append(broker, "--min-health-score", "0")...)...)
	if code != 1 || !strings.Contains(out, "excluded, by reason:") || !strings.Contains(out, "0 candidate(s), 5 excluded") {
		t.Errorf("%s: exit %d, want 1 with every reason counted:\n%s\n%s", hint, code, out, errOut)
	}
}
