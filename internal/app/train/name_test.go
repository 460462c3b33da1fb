package train

import (
	"strings"
	"testing"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

func TestTrainRunName(t *testing.T) {
	t.Parallel()
	spec := []byte("name: llm-finetune\nruntime: {}\n")
	tests := []struct {
		name string
		flag string
		env  map[string]string
		want string
	}{
		{"spec name outside CI", "", nil, "llm-finetune"},
		{"the given name wins", "bert", nil, "bert"},
		{"GitHub Actions adds the short commit", "", map[string]string{"GITHUB_SHA": "8a3f9b21c0ffee00"}, "llm-finetune-8a3f9b2"},
		{"GitLab's short sha", "bert", map[string]string{"CI_COMMIT_SHORT_SHA": "1234abcd", "GITHUB_SHA": "ffff"}, "bert-1234abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := RunName(tt.flag, spec, func(k string) string { return tt.env[k] }); got != tt.want {
				t.Errorf("RunName = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestErrHintsFitTheFailure: a run no node could take names the dry-run
// that gives every node's reason; one that waited in the queue until its
// --queue-timeout (nodes busy, not unfit) does not, its reason saying
// what to do.
func TestErrHintsFitTheFailure(t *testing.T) {
	t.Parallel()
	failed := gpupassv1.AllocState_ALLOC_STATE_FAILED
	r := &Result{spec: "gpupass.yaml", Runs: []*gpupassv1.Run{
		{Id: "alloc-1", Region: "us-west-2", State: failed, Reason: "no certified node in us-west-2: 2 excluded"},
		{Id: "alloc-2", Region: "eu-central-1", State: failed, QueuedUnixNano: 1,
			Reason: "waited 10s in the queue at position 1 for 1 busy certified node in eu-central-1: raise --queue-timeout or add nodes"},
	}}
	msg := r.Err().Error()
	if !strings.Contains(msg, "no certified node in us-west-2: 2 excluded (every node's reason: gpupass validate --dry-run --region us-west-2 --excluded summary)") {
		t.Errorf("the unplaced run has no dry-run hint:\n%s", msg)
	}
	if strings.Count(msg, "every node's reason") != 1 || !strings.HasSuffix(msg, "raise --queue-timeout or add nodes") {
		t.Errorf("the run that waited out its queue timeout got the dry-run hint, or lost its reason:\n%s", msg)
	}
}
