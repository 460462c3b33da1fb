package broker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// Issue #35: the CI context the submission that started a group gave
// (gpupass train in a pull request's job) travels in the group's webhook
// event, so the workflow the event starts knows which pull request to
// comment on. Only the starting submission gives it; a bad one is
// refused before anything is stored.
func TestWebhookCarriesGroupCI(t *testing.T) {
	t.Parallel()
	cfg := brokertest.Fast()
	cfg.Webhooks = fastHooks()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)
	rec := newReceiver(t, nil)
	hook := addHook(t, b.Store, rec.URL)
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	ci := &gpupassv1.CIContext{Forge: "github", Repository: "acme/train", PullRequest: 7, Sha: "0123456789abcdef0123456789abcdef01234567",
		RunUrl: "https://github.com/acme/train/actions/runs/42"}

	first := submit(t, c, "us-west-2", func(r *gpupassv1.SubmitRequest) { r.GroupSize, r.Ci = 2, ci })
	// Joining the group with a context of its own is refused: the
	// group's is the starting submission's.
	_, err := c.Run.Submit(context.Background(), connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: specYAML(t), Region: "eu-central-1", Command: []string{"python3", "train.py"},
		Group: first.Group, Ci: &gpupassv1.CIContext{Forge: "github", Repository: "acme/train", PullRequest: 8}}))
	if fe := api.FieldErrorOf(err); connect.CodeOf(err) != connect.CodeInvalidArgument || fe == nil || fe.Field != api.FieldSubmitCI {
		t.Errorf("joining with a CI context: %v; want invalid argument on field %s", err, api.FieldSubmitCI)
	}
	second := submit(t, c, "eu-central-1", func(r *gpupassv1.SubmitRequest) { r.Group = first.Group })
	for _, id := range []string{first.Id, second.Id} {
		if _, err := c.Run.Cancel(context.Background(), connect.NewRequest(&gpupassv1.CancelRequest{AllocId: id})); err != nil {
			t.Fatal(err)
		}
	}
	waitDeliveries(t, b.Store, hook.ID, 1)
	got := rec.got()
	if len(got) != 1 {
		t.Fatalf("receiver got %d events, want 1", len(got))
	}
	var ev broker.GroupEvent
	if err := json.Unmarshal(got[0].body, &ev); err != nil {
		t.Fatal(err)
	}
	want := &broker.GroupCI{Forge: "github", Repository: "acme/train", PullRequest: 7, SHA: ci.Sha, RunURL: ci.RunUrl}
	if diff := cmp.Diff(want, ev.CI); diff != "" || ev.Group != first.Group || len(ev.Runs) != 2 {
		t.Errorf("event of group %s: %s; ci (-want +got):\n%s", first.Group, got[0].body, diff)
	}
	if !strings.Contains(string(got[0].body), `"ci":{"forge":"github","repository":"acme/train","pull_request":7,`) {
		t.Errorf("event body %s lacks the documented \"ci\" object", got[0].body)
	}

	// A group submitted with no context has none in its event.
	hook2 := addHook(t, b.Store, newReceiver(t, nil).URL)
	plain := endGroup(t, c, "us-west-2")
	for _, d := range waitDeliveries(t, b.Store, hook2.ID, 1) {
		if d.Group != plain || strings.Contains(string(d.Body), `"ci"`) {
			t.Errorf("event of group %s, without CI context: %s", plain, d.Body)
		}
	}
}

// Issue #35: every field of a CI context has its forge's form, so a
// receiver can hand it on (a workflow's input, a pipeline variable); a
// refused one stores no run.
func TestSubmitRefusesBadGroupCI(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	good := func() *gpupassv1.CIContext {
		return &gpupassv1.CIContext{Forge: "gitlab", Repository: "acme/ml/train", PullRequest: 3, Sha: "0123abc", RunUrl: "https://gitlab.example/acme/ml/train/-/pipelines/9", ProjectId: "42"}
	}
	for _, tc := range []struct {
		name, want string
		mod        func(*gpupassv1.CIContext)
	}{
		{"forge", "ci.forge", func(c *gpupassv1.CIContext) { c.Forge = "bitbucket" }},
		{"repository with shell", "ci.repository", func(c *gpupassv1.CIContext) { c.Repository = "acme/$(id)" }},
		{"repository climbing", "ci.repository", func(c *gpupassv1.CIContext) { c.Repository = "acme/../x" }},
		{"repository too long", "ci.repository", func(c *gpupassv1.CIContext) { c.Repository = "a/" + strings.Repeat("b", 300) }},
		{"negative pull request", "ci.pull_request", func(c *gpupassv1.CIContext) { c.PullRequest = -1 }},
		{"sha", "ci.sha", func(c *gpupassv1.CIContext) { c.Sha = "main" }},
		{"run url with credentials", "ci.run_url", func(c *gpupassv1.CIContext) { c.RunUrl = "https://user:pw@gitlab.example/p" }},
		{"run url not http", "ci.run_url", func(c *gpupassv1.CIContext) { c.RunUrl = "javascript:alert(1)" }},
		{"run url with a newline", "ci.run_url", func(c *gpupassv1.CIContext) { c.RunUrl = "https://x.example/a\nb" }},
		{"project id on github", "ci.project_id", func(c *gpupassv1.CIContext) { c.Forge = "github" }},
		{"project id not numeric", "ci.project_id", func(c *gpupassv1.CIContext) { c.ProjectId = "acme%2Ftrain" }},
	} {
		ci := good()
		tc.mod(ci)
		_, err := c.Run.Submit(context.Background(), connect.NewRequest(&gpupassv1.SubmitRequest{
			SpecYaml: specYAML(t), Region: "us-west-2", Command: []string{"python3", "train.py"}, Ci: ci}))
		if fe := api.FieldErrorOf(err); connect.CodeOf(err) != connect.CodeInvalidArgument || fe == nil || fe.Field != api.FieldSubmitCI || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want invalid argument on field %s naming %s", tc.name, err, api.FieldSubmitCI, tc.want)
		}
	}
	runs, err := b.Store.(store.Runs).ListAllocs(context.Background(), 10, nil)
	if err != nil || len(runs) != 0 {
		t.Errorf("refused submissions stored %d runs, %v", len(runs), err)
	}
	submit(t, c, "us-west-2", func(r *gpupassv1.SubmitRequest) { r.Ci = good() })
}
