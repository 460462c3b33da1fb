// Package depcheck holds the test that keeps the import rules of STYLE.md
// true: broker and agent never import each other, the agent stays small,
// and the pure packages import no network code.
package depcheck

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

const module = "github.com/gpupass/gpupass"

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func listDeps(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps", "./...")
	cmd.Dir = testutil.RepoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func under(path, prefix string) bool {
	full := module + "/" + prefix
	return path == full || strings.HasPrefix(path, full+"/")
}

// rules: packages under `from` must not depend on anything matching a
// forbidden prefix (module-relative when it starts with ".", else absolute).
// A direct rule checks only the package's own imports (cosign, which the
// audit use case links, itself pulls cobra in).
var rules = []struct {
	from      string
	forbidden []string
	why       string
	direct    bool
}{
	{"broker", []string{"./agent"}, "the broker never imports the agent (they meet only in internal/api)", false},
	{"agent", []string{"./broker", "./internal/cli", "github.com/sigstore/", "github.com/google/go-github", "gitlab.com/gitlab-org/api/"}, "the agent stays small: no broker, no CLI, no cosign, no forge clients", false},
	{"agent", []string{"./internal/command", "github.com/spf13/cobra", "github.com/spf13/pflag"}, "the daemon has no command layer: cobra and flags live in internal/command/agent", false},
	{"cmd/gpupass-agent", []string{"./broker", "./internal/cli", "github.com/sigstore/", "github.com/google/go-github", "gitlab.com/gitlab-org/api/"}, "the agent binary stays small", false},
	{"broker", []string{"./internal/cli", "github.com/sigstore/", "github.com/google/go-github", "gitlab.com/gitlab-org/api/", "github.com/olekukonko/tablewriter"}, "the broker links no CLI, signing, forge or table-rendering code", false},
	{"cmd/gpupass-broker", []string{"./internal/cli", "github.com/sigstore/", "github.com/google/go-github", "gitlab.com/gitlab-org/api/", "github.com/olekukonko/tablewriter"}, "the broker binary stays small", false},
	{"broker", []string{"./internal/app", "./internal/command"}, "arrows point down: the daemons never import the CLI's use cases or command layer", false},
	{"agent", []string{"./internal/app", "./internal/command"}, "arrows point down: the daemons never import the CLI's use cases or command layer", false},
	{"internal/app", []string{"github.com/spf13/cobra", "./internal/cli", "./internal/command"}, "use cases take typed options, not flags: no cobra, no command layer", true},
	{"internal/client", []string{"github.com/spf13/cobra", "./internal/cli", "./internal/command", "./internal/app"}, "the client sits below the use cases and knows no flags", false},
	{"internal/spec", []string{"net/http", "net", "google.golang.org/grpc", "connectrpc.com/"}, "spec is pure", false},
	{"internal/metrics", []string{"net/http", "net", "connectrpc.com/"}, "metrics is pure", false},
	{"internal/report", []string{"net/http", "net", "connectrpc.com/"}, "report is pure", false},
	{"internal/conformance", []string{"github.com/sigstore/", "./internal/audit", "net/http"}, "the agent imports conformance: it stays free of cosign and network code", false},
}

func TestImportRules(t *testing.T) {
	t.Parallel()
	pkgs := listDeps(t)
	if len(pkgs) == 0 {
		t.Fatal("go list returned no packages")
	}
	for _, r := range rules {
		for _, p := range pkgs {
			if !under(p.ImportPath, r.from) {
				continue
			}
			deps := p.Deps
			if r.direct {
				deps = p.Imports
			}
			for _, d := range deps {
				for _, f := range r.forbidden {
					bad := false
					if strings.HasPrefix(f, "./") {
						bad = under(d, f[2:])
					} else if strings.HasSuffix(f, "/") {
						bad = strings.HasPrefix(d, f)
					} else {
						bad = d == f || strings.HasPrefix(d, f+"/")
					}
					if bad {
						t.Errorf("%s imports %s: %s", p.ImportPath, d, r.why)
					}
				}
			}
		}
	}
}

// TestRuleMatcherCanFail checks the matcher itself on a made-up graph, so a
// broken matcher cannot make TestImportRules pass vacuously.
func TestRuleMatcherCanFail(t *testing.T) {
	t.Parallel()
	if !under(module+"/agent/spool", "agent") {
		t.Error("agent/spool should be under agent")
	}
	if under(module+"/agentx", "agent") {
		t.Error("agentx must not be under agent")
	}
}
