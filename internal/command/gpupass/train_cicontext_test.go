package gpupass_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/output"
)

// Issue #35: the train step of a pull request's workflow (GitHub) or a
// merge request's pipeline (GitLab) records where it ran with its run
// group, as the forge posters read it from the job's variables, so the
// workflow the group's webhook starts comments on that pull request.
// Outside CI, or with variables that make no valid context, the group
// has none.
func TestTrainRecordsCIContext(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	tok := b.Token(t, store.RoleSubmit, "*")
	spec := writeH100Spec(t)
	dir := t.TempDir()
	event := filepath.Join(dir, "event.json")
	if err := os.WriteFile(event, []byte(`{"pull_request":{"number":7,"head":{"sha":"0123456789abcdef0123456789abcdef01234567"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	github := map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": filepath.Join(dir, "output"), "GITHUB_STEP_SUMMARY": filepath.Join(dir, "summary"),
		"GITHUB_EVENT_PATH": event, "GITHUB_REPOSITORY": "acme/train", "GITHUB_SERVER_URL": "https://github.com", "GITHUB_RUN_ID": "99",
		"GITHUB_SHA": "fedcba9876543210fedcba9876543210fedcba98", "GITHUB_API_URL": "https://api.github.com"}
	gitlab := map[string]string{"GITLAB_CI": "true", "GPUPASS_DOTENV": filepath.Join(dir, "gpupass.env"), "CI_PROJECT_PATH": "acme/ml/train",
		"CI_MERGE_REQUEST_IID": "3", "CI_MERGE_REQUEST_PROJECT_ID": "42", "CI_API_V4_URL": "https://gitlab.example/api/v4",
		"CI_COMMIT_SHA": "0123abc0123abc0123abc0123abc0123abc0123a", "CI_PIPELINE_ID": "512", "CI_PIPELINE_URL": "https://gitlab.example/acme/ml/train/-/pipelines/512"}
	with := func(m map[string]string, k, v string) map[string]string {
		c := map[string]string{}
		for kk, vv := range m {
			c[kk] = vv
		}
		c[k] = v
		return c
	}
	for _, tc := range []struct {
		name   string
		format output.Format
		env    map[string]string
		want   *broker.GroupCI
	}{
		{"github pull request", "github", github, &broker.GroupCI{Forge: "github", Repository: "acme/train", PullRequest: 7,
			SHA: "0123456789abcdef0123456789abcdef01234567", RunURL: "https://github.com/acme/train/actions/runs/99"}},
		{"github, a plain train step", "", github, &broker.GroupCI{Forge: "github", Repository: "acme/train", PullRequest: 7,
			SHA: "0123456789abcdef0123456789abcdef01234567", RunURL: "https://github.com/acme/train/actions/runs/99"}},
		{"gitlab merge request", "gitlab", gitlab, &broker.GroupCI{Forge: "gitlab", Repository: "acme/ml/train", PullRequest: 3,
			SHA: "0123abc0123abc0123abc0123abc0123abc0123a", RunURL: "https://gitlab.example/acme/ml/train/-/pipelines/512", ProjectID: "42"}},
		{"gitlab branch pipeline", "gitlab", with(with(gitlab, "CI_MERGE_REQUEST_IID", ""), "CI_PROJECT_ID", "42"), &broker.GroupCI{Forge: "gitlab",
			Repository: "acme/ml/train", SHA: "0123abc0123abc0123abc0123abc0123abc0123a", RunURL: "https://gitlab.example/acme/ml/train/-/pipelines/512", ProjectID: "42"}},
		// A run URL with a space would be refused by the broker: the
		// runs go, without a context.
		{"variables that make none", "gitlab", with(gitlab, "CI_PIPELINE_URL", "https://gitlab.example/a b"), nil},
		{"outside CI", "", map[string]string{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			o := &gpupass.TrainOptions{Global: &gpupass.GlobalOptions{Output: tc.format}, Broker: gpupass.BrokerFlags{URL: b.URL, Token: tok},
				Options: apptrain.Options{Spec: spec, Regions: []string{"us-west-2", "eu-central-1"}, Command: []string{"true"}, NoWorkdir: true,
					Getenv: func(k string) string { return tc.env[k] }}}
			// No node takes the runs (they fail at once): the group
			// is what matters here.
			err := gpupass.RunTrain(context.Background(), o, &out, &errOut)
			group := groupRE.FindString(out.String())
			if group == "" {
				t.Fatalf("train printed no group: %v\n%s\n%s", err, out.String(), errOut.String())
			}
			raw, err := b.Store.(store.Runs).GroupCI(context.Background(), group)
			if err != nil {
				t.Fatal(err)
			}
			var got *broker.GroupCI
			if raw != nil {
				got = &broker.GroupCI{}
				if err := json.Unmarshal(raw, got); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("CI context of group %s (-want +got):\n%s", group, diff)
			}
			if warned := strings.Contains(errOut.String(), "the run group goes without its CI context"); warned != (tc.name == "variables that make none") {
				t.Errorf("warned %v that the group has no CI context:\n%s", warned, errOut.String())
			}
		})
	}
}
