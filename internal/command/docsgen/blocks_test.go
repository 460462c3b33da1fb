package docsgen

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestShellBlocks(t *testing.T) {
	t.Parallel()
	src := "# Page\n\n" +
		"```sh\ngpupass version\n```\n\n" + // 3: runs
		"<!-- not-run: needs a Slurm cluster -->\n\n```bash\nsbatch x\n```\n\n" + // 9: marked, a blank line between
		"```yaml\nkey: value\n```\n\n" + // not a shell block
		"- a list:\n\n  <!-- needs: cluster -->\n  ```sh\n  kubectl get nodes\n  ```\n\n" + // 20: indented
		"````markdown\n```sh\nnot a block of its own\n```\n````\n"
	got, err := ShellBlocks([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []Block{
		{Line: 3, Body: "gpupass version"},
		{Line: 9, Body: "sbatch x", NotRun: "not-run: needs a Slurm cluster"},
		{Line: 20, Body: "  kubectl get nodes", NotRun: "needs: cluster"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ShellBlocks (-want +got):\n%s", diff)
	}
}

func TestShellBlocksBadMarkers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, src, want string }{
		{"no reason", "<!-- not-run: -->\n```sh\nx\n```\n", "line 1: not-run marker without a reason"},
		{"before text", "<!-- not-run: slow -->\nSome prose.\n```sh\nx\n```\n", "line 1: the not-run marker is followed by text"},
		{"before a yaml block", "<!-- needs: cluster -->\n```yaml\na: 1\n```\n", `followed by a "yaml" block`},
		{"at the end", "```sh\nx\n```\n<!-- needs: cluster -->\n", "followed by no shell block"},
		{"unclosed fence", "```sh\nx\n", "never closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ShellBlocks([]byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ShellBlocks = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
