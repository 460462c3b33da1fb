package gpupass_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

var groupRE = regexp.MustCompile(`group-[0-9a-f]{16}`)

// Issue #35: train submits its regions as one run group, prints the group
// beside the allocations, and `runs --group` lists just those runs.
func TestTrainGroupAndRunsGroup(t *testing.T) {
	t.Parallel()
	url, tok := runsBroker(t, false)
	spec := writeH100Spec(t)
	broker := []string{"--broker-url", url, "--broker-token", tok}
	train := func(regions ...string) (ids []string, group, out string) {
		t.Helper()
		args := []string{"train", "--spec", spec, "--min-health-score", "0"}
		for _, r := range regions {
			args = append(args, "--region", r)
		}
		code, out, errOut := runMain(t, append(append(args, broker...), "--", "true")...)
		if code != 0 {
			t.Fatalf("train: exit %d\n%s\n%s", code, out, errOut)
		}
		return allocRE.FindAllString(out, -1), groupRE.FindString(out), out
	}
	ids, group, out := train("us-west-2", "ap-south-1")
	if len(ids) != 2 || group == "" || !strings.Contains(out, "gpupass runs --group "+group) {
		t.Fatalf("train of two regions printed allocs %v and group %q:\n%s", ids, group, out)
	}
	_, other, _ := train("ap-south-1")
	if other == "" || other == group {
		t.Fatalf("a second train's group = %q, want a new one (first %s)", other, group)
	}

	// JSON: every run carries the group.
	args := []string{"train", "--spec", spec, "--min-health-score", "0", "--region", "us-west-2", "--region", "ap-south-1", "-o", "json"}
	code, out, errOut := runMain(t, append(append(args, broker...), "--", "true")...)
	var sub struct {
		Runs []struct {
			ID    string `json:"id"`
			Group string `json:"group"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &sub); code != 0 || err != nil || len(sub.Runs) != 2 ||
		sub.Runs[0].Group == "" || sub.Runs[0].Group != sub.Runs[1].Group {
		t.Fatalf("train -o json: exit %d, %v, runs %+v\n%s\n%s", code, err, sub.Runs, out, errOut)
	}

	code, out, errOut = runMain(t, append([]string{"runs", "--group", group, "-o", "json"}, broker...)...)
	var list struct {
		Runs []struct {
			ID    string `json:"id"`
			Group string `json:"group"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil {
		t.Fatalf("runs --group: exit %d, %v\n%s\n%s", code, err, out, errOut)
	}
	var got []string
	for _, r := range list.Runs {
		if r.Group != group {
			t.Errorf("runs --group %s listed %s of group %q", group, r.ID, r.Group)
		}
		got = append(got, r.ID)
	}
	if strings.Join(got, " ") != strings.Join(ids, " ") {
		t.Errorf("runs --group %s = %v, want the train's %v (5 runs exist)", group, got, ids)
	}

	code, _, errOut = runMain(t, append([]string{"runs", "--group", "alloc-12345678"}, broker...)...)
	if code != 2 || !strings.Contains(errOut, "--group") || !strings.Contains(errOut, "16 hex digits") {
		t.Errorf("runs --group with an alloc id: exit %d\n%s", code, errOut)
	}
}
