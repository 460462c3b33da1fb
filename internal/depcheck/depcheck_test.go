// Package depcheck holds the test that keeps the import rules of STYLE.md
// true: broker and agent never import each other, the agent stays small,
// only the command layer imports cobra and pflag, and the pure packages
// import no network code.
package depcheck

import (
	"encoding/json"
	"fmt"
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
	{"internal/loadgen", []string{"./broker"}, "the load generator drives brokers over the protocol; it links none (its benchmark starts broker processes)", false},
	{"agent", []string{"./broker", "github.com/sigstore/", "github.com/google/go-github", "gitlab.com/gitlab-org/api/"}, "the agent stays small: no broker, no cosign, no forge clients", false},
	{"agent", []string{"github.com/spf13/cobra"}, "the daemon has no command layer: cobra and flags live in internal/command/agent", false},
	// Direct only: client-go's kubeconfig loader (agent/executor/kubernetes)
	// links pflag itself, for flag bindings the agent never calls.
	{"agent", []string{"github.com/spf13/pflag"}, "the daemon has no command layer: cobra and flags live in internal/command/agent", true},
	{"cmd/gpupass-agent", []string{"./broker", "./internal/command/gpupass", "./internal/command/broker", "./internal/app", "github.com/sigstore/", "github.com/google/go-github", "gitlab.com/gitlab-org/api/"}, "the agent binary stays small", false},
	{"broker", []string{"github.com/sigstore/", "github.com/google/go-github", "gitlab.com/gitlab-org/api/", "github.com/olekukonko/tablewriter"}, "the broker links no signing, forge or table-rendering code", false},
	{"cmd/gpupass-broker", []string{"./internal/command/gpupass", "./internal/command/agent", "./internal/app", "github.com/sigstore/", "github.com/google/go-github", "gitlab.com/gitlab-org/api/", "github.com/olekukonko/tablewriter"}, "the broker binary stays small", false},
	{"broker", []string{"./internal/app", "./internal/command"}, "arrows point down: the daemons never import the CLI's use cases or any command layer", false},
	{"agent", []string{"./internal/app", "./internal/command"}, "arrows point down: the daemons never import the CLI's use cases or any command layer", false},
	{"internal/app", []string{"github.com/spf13/cobra", "github.com/spf13/pflag", "./internal/command"}, "use cases take typed options, not flags: no cobra, no command layer", true},
	{"internal/client", []string{"github.com/spf13/cobra", "./internal/command", "./internal/app"}, "the client sits below the use cases and knows no flags", false},
	{"internal/spec", []string{"net/http", "net", "google.golang.org/grpc", "connectrpc.com/"}, "spec is pure", false},
	{"internal/metrics", []string{"net/http", "net", "connectrpc.com/"}, "metrics is pure", false},
	{"internal/report", []string{"net/http", "net", "connectrpc.com/"}, "report is pure", false},
	{"internal/rendezvous", []string{"net/http", "os/exec", "connectrpc.com/", "google.golang.org/grpc"}, "rendezvous only computes an environment: it dials, resolves and starts nothing (net/netip parses addresses; net itself it does not need)", false},
	// gpupass up takes the executors' flags as data (executorflags).
	{"cmd/gpupass", []string{"./agent", "./internal/command/agent", "k8s.io/"}, "gpupass links no executor: up takes their flags from internal/command/executorflags, and client-go would double gpupass's size and start", false},
	{"internal/command/executorflags", []string{"./agent"}, "gpupass embeds the executors' flags as data and links none of them", false},
	{"cmd/gpupass-agent", []string{"gonum.org/v1/plot", "./internal/report"}, "the agent draws no charts: gonum/plot and its fonts link only into gpupass and gpupass-broker", false},
	{"internal/conformance", []string{"github.com/sigstore/", "./internal/audit", "net/http"}, "the agent imports conformance: it stays free of cosign and network code", false},
}

// contracts are plug-in contracts whose implementations are packages below
// them: the contract package itself (not the packages under it) depends on
// none of them, so a build leaves a backend out by not listing it, and a
// backend cannot reach into another through the contract.
var contracts = []struct {
	pkg   string
	impls []string
	why   string
}{
	{"agent/executor", []string{"agent/executor/local", "agent/executor/slurm", "agent/executor/kubernetes"}, "agent/executor is the executors' contract and the generic executor; the backends import it, never the other way round"},
}

// commandLayer is the layer only the binaries' main packages may import:
// cmd/X -> internal/command/X -> internal/app -> internal/client. A library
// (or another command layer) importing it would drag cobra and flag
// handling into code that should take typed options.
const commandLayer = "internal/command"

// sharedFlags are the command layer's own helpers (GPUPASS_* variables,
// renamed flags, the registry flag set, the CLI reference, --output and
// its formats): every command tree may import them, nothing outside the
// command layer may.
var sharedFlags = []string{commandLayer + "/flagenv", commandLayer + "/flagalias", commandLayer + "/registryflags", commandLayer + "/docsgen", commandLayer + "/output", commandLayer + "/executorflags"}

// commandTree is the command tree a command-layer package belongs to
// (internal/command/gpupass for internal/command/gpupass/auditcmd).
func commandTree(importPath string) string {
	rest := strings.TrimPrefix(importPath, module+"/"+commandLayer+"/")
	tree, _, _ := strings.Cut(rest, "/")
	return commandLayer + "/" + tree
}

// violations applies rules and the command-layer rule to a package graph
// and returns one line per broken rule.
func violations(pkgs []pkg) []string {
	var out []string
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
						out = append(out, fmt.Sprintf("%s imports %s: %s", p.ImportPath, d, r.why))
					}
				}
			}
		}
	}
	for _, c := range contracts {
		for _, p := range pkgs {
			if p.ImportPath != module+"/"+c.pkg {
				continue
			}
			for _, d := range p.Deps {
				for _, impl := range c.impls {
					if under(d, impl) {
						out = append(out, fmt.Sprintf("%s imports %s: %s", p.ImportPath, d, c.why))
					}
				}
			}
		}
	}
	// Only the command layer speaks cobra and pflag. Direct imports only:
	// cosign (the audit use case) and client-go's kubeconfig loader link
	// them for code paths gpupass never calls.
	for _, p := range pkgs {
		if under(p.ImportPath, "cmd") || under(p.ImportPath, commandLayer) {
			continue
		}
		for _, d := range p.Imports {
			if d == "github.com/spf13/cobra" || d == "github.com/spf13/pflag" || strings.HasPrefix(d, "github.com/spf13/cobra/") {
				out = append(out, fmt.Sprintf("%s imports %s: only cmd/... and %s/... import cobra and pflag; take typed options and let the command layer own the flags", p.ImportPath, d, commandLayer))
			}
		}
	}
	// Direct imports suffice: a transitive import of the command layer
	// needs some non-cmd package to import it directly.
	for _, p := range pkgs {
		if under(p.ImportPath, "cmd") {
			continue
		}
		for _, d := range p.Imports {
			// A command tree's sub-packages (internal/command/gpupass/auditcmd)
			// may use its own root: they are the same layer.
			if under(d, commandLayer) && !under(p.ImportPath, commandTree(d)) && !(under(p.ImportPath, commandLayer) && sharedFlag(d)) {
				out = append(out, fmt.Sprintf("%s imports %s: nothing but cmd/... imports %s/...; move the shared code down into internal/app or a library package", p.ImportPath, d, commandLayer))
			}
		}
	}
	return out
}

func sharedFlag(importPath string) bool {
	for _, s := range sharedFlags {
		if under(importPath, s) {
			return true
		}
	}
	return false
}

func TestImportRules(t *testing.T) {
	t.Parallel()
	pkgs := listDeps(t)
	if len(pkgs) == 0 {
		t.Fatal("go list returned no packages")
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
}

// TestRulesFire runs the rules on made-up graphs, so a rule that cannot
// fire (a typo in a prefix, a moved package) does not pass vacuously.
func TestRulesFire(t *testing.T) {
	t.Parallel()
	m := func(s string) string { return module + "/" + s }
	cases := []struct {
		name string
		p    pkg
		want string // substring of a violation; "" means none
	}{
		{"cmd may import its command layer", pkg{ImportPath: m("cmd/gpupass"), Imports: []string{m("internal/command/gpupass")}, Deps: []string{m("internal/command/gpupass")}}, ""},
		{"a library importing a command layer", pkg{ImportPath: m("internal/report"), Imports: []string{m("internal/command/gpupass")}}, "nothing but cmd/..."},
		{"one command layer importing another", pkg{ImportPath: m("internal/command/gpupass"), Imports: []string{m("internal/command/agent")}}, "nothing but cmd/..."},
		{"the broker daemon importing its command layer", pkg{ImportPath: m("broker"), Imports: []string{m("internal/command/broker")}, Deps: []string{m("internal/command/broker")}}, "the daemons never import"},
		{"the agent daemon importing a use case", pkg{ImportPath: m("agent/spool"), Deps: []string{m("internal/app/audit")}}, "the daemons never import"},
		{"a command tree importing the shared flag helpers", pkg{ImportPath: m("internal/command/gpupass/bundlecmd"), Imports: []string{m("internal/command/flagenv"), m("internal/command/registryflags")}}, ""},
		{"a command tree importing the output module", pkg{ImportPath: m("internal/command/broker"), Imports: []string{m("internal/command/output")}}, ""},
		{"a library importing the output module", pkg{ImportPath: m("internal/app/train"), Imports: []string{m("internal/command/output")}}, "nothing but cmd/..."},
		{"a library importing the shared flag helpers", pkg{ImportPath: m("internal/client"), Imports: []string{m("internal/command/flagenv")}}, "nothing but cmd/..."},
		{"a command tree's sub-package importing its root", pkg{ImportPath: m("internal/command/gpupass/auditcmd"), Imports: []string{m("internal/command/gpupass")}}, ""},
		{"a use case importing the command layer", pkg{ImportPath: m("internal/app/audit"), Imports: []string{m("internal/command/gpupass")}}, "no command layer"},
		{"a use case importing cobra", pkg{ImportPath: m("internal/app/compare"), Imports: []string{"github.com/spf13/cobra"}}, "use cases take typed options"},
		{"a use case importing pflag", pkg{ImportPath: m("internal/app/localstack"), Imports: []string{"github.com/spf13/pflag"}}, "use cases take typed options"},
		{"a library importing pflag", pkg{ImportPath: m("internal/flagenv"), Imports: []string{"github.com/spf13/pflag"}}, "only cmd/... and internal/command/... import cobra and pflag"},
		{"a library importing cobra/doc", pkg{ImportPath: m("internal/docsgen"), Imports: []string{"github.com/spf13/cobra/doc"}}, "only cmd/... and internal/command/... import cobra and pflag"},
		{"a shared command helper importing pflag", pkg{ImportPath: m("internal/command/flagenv"), Imports: []string{"github.com/spf13/pflag"}}, ""},
		{"a main importing cobra", pkg{ImportPath: m("cmd/gpupass"), Imports: []string{"github.com/spf13/cobra"}}, ""},
		{"a library linking cobra through a dependency", pkg{ImportPath: m("internal/audit"), Deps: []string{"github.com/spf13/cobra"}}, ""},
		{"the executor contract importing the local executor", pkg{ImportPath: m("agent/executor"), Deps: []string{m("agent/executor/local")}}, "the backends import it, never the other way round"},
		{"the executor contract linking the Slurm backend", pkg{ImportPath: m("agent/executor"), Deps: []string{m("agent/spool"), m("agent/executor/slurm")}}, "the backends import it, never the other way round"},
		{"a backend importing the executor contract", pkg{ImportPath: m("agent/executor/local"), Imports: []string{m("agent/executor")}, Deps: []string{m("agent/executor")}}, ""},
		{"gpupass linking an executor", pkg{ImportPath: m("cmd/gpupass"), Deps: []string{m("internal/command/executorflags"), m("agent/executor/kubernetes"), "k8s.io/client-go/kubernetes"}}, "gpupass links no executor"},
		{"gpupass linking the executors' flags as data", pkg{ImportPath: m("cmd/gpupass"), Imports: []string{m("internal/command/gpupass")}, Deps: []string{m("internal/command/gpupass"), m("internal/command/executorflags")}}, ""},
		{"a command tree importing the executors' flags", pkg{ImportPath: m("internal/command/gpupass"), Imports: []string{m("internal/command/executorflags")}}, ""},
		{"a use case may import the client", pkg{ImportPath: m("internal/app/train"), Imports: []string{m("internal/client")}, Deps: []string{m("internal/client")}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := strings.Join(violations([]pkg{c.p}), "\n")
			if c.want == "" && got != "" {
				t.Errorf("want no violation, got:\n%s", got)
			}
			if c.want != "" && !strings.Contains(got, c.want) {
				t.Errorf("want a violation containing %q, got:\n%s", c.want, got)
			}
		})
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
