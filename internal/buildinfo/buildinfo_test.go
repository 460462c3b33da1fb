package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRead(t *testing.T) {
	t.Parallel()
	vcs := []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"},
		{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
		{Key: "vcs.modified", Value: "false"},
	}
	tests := []struct {
		name string
		set  string
		bi   *debug.BuildInfo
		want Info
		str  string
	}{
		{name: "linker flag wins over the module version", set: "v1.2.3",
			bi:   &debug.BuildInfo{Main: debug.Module{Version: "v1.2.2"}, Settings: vcs},
			want: Info{Version: "v1.2.3", Commit: "0123456789ab", Date: "2026-01-02T03:04:05Z"},
			str:  "v1.2.3 (commit 0123456789ab, 2026-01-02T03:04:05Z)"},
		{name: "go install of a tag", bi: &debug.BuildInfo{Main: debug.Module{Version: "v1.2.2"}},
			want: Info{Version: "v1.2.2"}, str: "v1.2.2"},
		{name: "checkout with changes",
			bi: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}},
			want: Info{Version: "dev", Commit: "abc-dirty"}, str: "dev (commit abc-dirty)"},
		{name: "no build info", want: Info{Version: "dev"}, str: "dev"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := read(tt.set, func() (*debug.BuildInfo, bool) { return tt.bi, tt.bi != nil })
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("read (-want +got):\n%s", d)
			}
			if got.String() != tt.str {
				t.Errorf("String() = %q, want %q", got.String(), tt.str)
			}
		})
	}
}
