package kubernetes

import (
	"strings"
	"testing"
)

// TestKubeRunAs: --kube-run-as defaults to the agent's own uid and gid
// when it is not root (the image's user when it is), and a non-root agent
// refuses pods of another uid, whose files it could not delete.
func TestKubeRunAs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		v          string
		euid, egid int
		want       *RunAs
		err        string
	}{
		{"default, non-root agent", "", 65532, 65532, &RunAs{UID: 65532, GID: 65532}, ""},
		{"default, root agent", "", 0, 0, nil, ""},
		{"image", "image", 65532, 65532, nil, ""},
		{"given, root agent", "1000:2000", 0, 0, &RunAs{UID: 1000, GID: 2000}, ""},
		{"given, the agent's own", "65532:100", 65532, 65532, &RunAs{UID: 65532, GID: 100}, ""},
		{"another uid than a non-root agent's", "1000:1000", 65532, 65532, nil, "could not delete what pods running as uid 1000 write"},
		{"not numbers", "nonroot", 0, 0, nil, "give UID:GID"},
		{"no group", "1000", 0, 0, nil, "give UID:GID"},
		{"negative", "-1:0", 0, 0, nil, "give UID:GID"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := kubeRunAs(tt.v, tt.euid, tt.egid)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("kubeRunAs(%q) = %v, %v; want an error with %q", tt.v, got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tt.want == nil) || got != nil && *got != *tt.want {
				t.Errorf("kubeRunAs(%q) as %d:%d = %+v, want %+v", tt.v, tt.euid, tt.egid, got, tt.want)
			}
		})
	}
}
