// Package buildinfo is the one place that knows which version of gpupass
// is running: the CLI, the broker and the agent all print it with
// --version, the agent sends it at enrollment and the clients put it in
// their User-Agent. Release builds set it with one linker flag, the same
// for all three binaries:
//
//	go build -ldflags "-X github.com/gpupass/gpupass/internal/buildinfo.Version=v1.2.3" ./cmd/...
//
// Without the flag (go install, go build in a checkout) the version comes
// from the module and VCS information the Go toolchain embeds, so a
// binary never claims a release it is not. It imports nothing of the
// project, so every binary may link it.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"sync"
)

// Version is set at build time with -ldflags "-X …/internal/buildinfo.Version=v1.2.3".
// Read it through Get: empty means "not set", and Get falls back to what the
// toolchain recorded.
var Version = ""

// Info is what a binary knows about its own build.
type Info struct {
	Version string `json:"version"`          // v1.2.3, a Go pseudo-version, or "dev"
	Commit  string `json:"commit,omitempty"` // VCS revision, "-dirty" when the tree had changes
	Date    string `json:"date,omitempty"`   // commit time, RFC 3339
}

var (
	once sync.Once
	info Info
)

// Get returns the running binary's build information.
func Get() Info {
	once.Do(func() { info = read(Version, debug.ReadBuildInfo) })
	return info
}

// read is Get without the process globals, for tests.
func read(set string, rbi func() (*debug.BuildInfo, bool)) Info {
	i := Info{Version: set}
	bi, ok := rbi()
	if ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Commit = s.Value
			case "vcs.time":
				i.Date = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(i.Commit) > 12 {
			i.Commit = i.Commit[:12]
		}
		if dirty && i.Commit != "" {
			i.Commit += "-dirty"
		}
	}
	if i.Version == "" {
		i.Version = "dev"
	}
	return i
}

// String is the --version line: the version, then commit and date when
// known ("v1.2.3 (commit 0123456789ab, 2026-01-02T03:04:05Z)").
func (i Info) String() string {
	switch {
	case i.Commit != "" && i.Date != "":
		return fmt.Sprintf("%s (commit %s, %s)", i.Version, i.Commit, i.Date)
	case i.Commit != "":
		return fmt.Sprintf("%s (commit %s)", i.Version, i.Commit)
	}
	return i.Version
}

// UserAgent is the User-Agent product token of a gpupass program
// ("gpupass-agent/v1.2.3").
func UserAgent(program string) string { return program + "/" + Get().Version }
