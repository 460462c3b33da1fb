// Package flagenv ties every gpupass flag to an environment variable:
// --broker-url is GPUPASS_BROKER_URL, and a secret flag also reads
// GPUPASS_<FLAG>_FILE. All three binaries use it, so the rule is written
// once; it imports only cobra/pflag (the agent may use it).
package flagenv

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/editdist"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// Prefix is the prefix of every environment variable gpupass reads for its
// flags.
const Prefix = "GPUPASS_"

// Name returns the environment variable that sets a flag.
func Name(flag string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

var (
	secretMu sync.RWMutex
	secrets  = map[string]bool{}
)

// MarkSecret declares a flag as a secret (token, password): it also reads
// GPUPASS_<FLAG>_FILE and its value is never echoed in errors. Commands may
// be built concurrently (parallel tests), hence the lock.
func MarkSecret(flag string) {
	secretMu.Lock()
	secrets[flag] = true
	secretMu.Unlock()
}

// IsSecret reports whether a flag was declared with MarkSecret.
func IsSecret(flag string) bool {
	secretMu.RLock()
	defer secretMu.RUnlock()
	return secrets[flag]
}

// ValueError is a variable whose value its flag refused. Where refers to
// it in the message: the variable, unless the caller names it better (a
// CI step's input that sets the variable).
type ValueError struct {
	Flag, Var, Value string
	// Secret: the value is never in the message.
	Secret bool
	// Where names the variable in the message; empty is Var.
	Where string
	Err   error
}

func (e *ValueError) Error() string {
	where := e.Where
	if where == "" {
		where = e.Var
	}
	if e.Secret {
		return "invalid value in " + where
	}
	// pflag's bool says only "strconv.ParseBool: parsing …: invalid
	// syntax"; the fix is the values it takes.
	var ne *strconv.NumError
	if errors.As(e.Err, &ne) && ne.Func == "ParseBool" {
		return fmt.Sprintf("invalid value %q in %s: want true or false", e.Value, where)
	}
	return fmt.Sprintf("invalid value %q in %s: %v", e.Value, where, e.Err)
}

func (e *ValueError) Unwrap() error { return e.Err }

// Apply sets every flag of cmd (and its inherited persistent flags) that
// was not given on the command line from its environment variable.
func Apply(cmd *cobra.Command, getenv func(string) string) error {
	var firstErr error
	set := func(f *pflag.Flag) {
		if f.Changed || firstErr != nil || !HasEnv(f) {
			return
		}
		name := Name(f.Name)
		secret := IsSecret(f.Name)
		v := getenv(name)
		if v == "" && secret {
			if path := getenv(name + "_FILE"); path != "" {
				b, err := os.ReadFile(path)
				if err != nil {
					firstErr = fmt.Errorf("reading %s_FILE: %w", name, err)
					return
				}
				v = strings.TrimRight(string(b), "\r\n")
			}
		}
		if v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			firstErr = &ValueError{Flag: f.Name, Var: name, Value: v, Secret: secret, Err: err}
			return
		}
		f.Changed = true
	}
	// Aliases last, and only for a canonical flag the command line or
	// its own variable left unset: the new name wins over the old one.
	aliasGiven := map[string]bool{}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if to := aliasOf(f); to != "" && f.Changed {
			aliasGiven[to] = true
		}
	})
	canonical := func(f *pflag.Flag) {
		if aliasOf(f) == "" && !aliasGiven[f.Name] {
			set(f)
		}
	}
	cmd.Flags().VisitAll(canonical)
	cmd.InheritedFlags().VisitAll(canonical)
	alias := func(f *pflag.Flag) {
		to := aliasOf(f)
		if to == "" || f.Changed {
			return
		}
		if c := cmd.Flags().Lookup(to); c == nil || c.Changed {
			return
		}
		set(f)
		if f.Changed && firstErr == nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "%s is deprecated; use %s\n", Name(f.Name), Name(to))
		}
	}
	cmd.Flags().VisitAll(alias)
	cmd.InheritedFlags().VisitAll(alias)
	return firstErr
}

// noEnvAnnotation marks a flag that no environment variable sets (NoEnv).
const noEnvAnnotation = "gpupass-no-env"

// NoEnv makes the flag name of fs one that only the command line sets:
// its GPUPASS_<FLAG> is a variable something else sets for another
// meaning (the rendezvous' GPUPASS_RANK in every rank of a gang's job),
// which must not silently change what the command does there.
func NoEnv(fs *pflag.FlagSet, name string) {
	if err := fs.SetAnnotation(name, noEnvAnnotation, []string{}); err != nil {
		panic(err) // a programming error: no such flag
	}
}

// HasEnv says whether GPUPASS_<FLAG> sets f (all flags but NoEnv's).
func HasEnv(f *pflag.Flag) bool { return f.Annotations[noEnvAnnotation] == nil }

// aliasAnnotation marks a flag kept under an old name (see Alias).
const aliasAnnotation = "gpupass-alias-of"

// Alias registers old as a hidden, deprecated second name of the flag
// canonical (already defined in fs): both set the same value, and
// GPUPASS_<OLD> (or _FILE for a secret) still works, below
// GPUPASS_<CANONICAL>. Scripts and units written for the old name keep
// working and are told the new one.
func Alias(fs *pflag.FlagSet, canonical, old string) {
	c := fs.Lookup(canonical)
	if c == nil {
		panic("flagenv.Alias: no flag --" + canonical)
	}
	fs.AddFlag(&pflag.Flag{
		Name: old, Usage: c.Usage, Value: c.Value, DefValue: c.DefValue, NoOptDefVal: c.NoOptDefVal,
		Hidden: true, Deprecated: "use --" + canonical,
		Annotations: map[string][]string{aliasAnnotation: {canonical}},
	})
	if IsSecret(canonical) {
		MarkSecret(old)
	}
}

func aliasOf(f *pflag.Flag) string {
	if a := f.Annotations[aliasAnnotation]; len(a) == 1 {
		return a[0]
	}
	return ""
}

// Others are GPUPASS_* variables that are not flags of the binary at hand
// but are set or read elsewhere: the job environment the agent sets, the
// GitHub Action's and GitLab components' inputs, and the agent's and
// broker's own flags. A binary does not warn about them (see Typos).
var Others = []string{
	"GPUPASS_ALLOC_ID", "GPUPASS_REGION", "GPUPASS_ATTEMPT", "GPUPASS_METRICS_FILE", "GPUPASS_CHECKPOINT_DIR",
	"GPUPASS_RESUME_FROM", "GPUPASS_PROBE", "GPUPASS_ALLOCATION_IDS", "GPUPASS_DOTENV", "GPUPASS_VERDICT",
	"GPUPASS_REPORT_PATH", "GPUPASS_REPORT_DIR", "GPUPASS_AUDIT_PATH", "GPUPASS_BUNDLE_DIGEST", "GPUPASS_FINGERPRINT",
	"GPUPASS_REGIONS", "GPUPASS_RUNS", "GPUPASS_TAG", "GPUPASS_SPEC", "GPUPASS_NAME", "GPUPASS_COMMAND",
	"GPUPASS_TRAIN_COMMAND", "GPUPASS_TOLERANCE", "GPUPASS_FAIL_ON_DIVERGENCE", "GPUPASS_COMMENT_BEHAVIOR",
	"GPUPASS_COSIGN_KEY", "GPUPASS_COSIGN_PASSWORD", "GPUPASS_GITHUB_TOKEN", "GPUPASS_GITLAB_TOKEN",
	"GPUPASS_INSTALL_VERSION", "GPUPASS_ACTION_PATH", "GPUPASS_ACTION_REPOSITORY", "GPUPASS_ACTION_STEP", "GPUPASS_TOOLS_DIR",
	"GPUPASS_WHEELHOUSE", "GPUPASS_WORKDIR", "GPUPASS_RUN_FILE", "GPUPASS_REGISTRY_REF", "GPUPASS_STATE_DIR",
	"GPUPASS_TOKEN", "GPUPASS_DB", "GPUPASS_KEY", "GPUPASS_COUNT", "GPUPASS_QUERY_ADDR", "GPUPASS_READ_PROBE_MB",
	"GPUPASS_PRICE_PER_HOUR", "GPUPASS_PROVIDER", "GPUPASS_ZONE", "GPUPASS_HOSTNAME", "GPUPASS_LISTEN",
	"GPUPASS_SIMULATE", "GPUPASS_RUN_AS", "GPUPASS_ROLE", "GPUPASS_NOTE", "GPUPASS_PYTHON", "GPUPASS_NVCC",
}

// Typos returns a warning for each GPUPASS_* variable of environ
// ("NAME=value") that is none of known nor Others but is within two edits
// (one for a short name) of one of known: most likely a misspelt setting, which would otherwise
// be ignored without a word. A variable far from every known one is left
// alone: it may belong to another tool of the same prefix.
func Typos(environ []string, known map[string]bool) []string {
	others := othersSet()
	var warnings []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !unknown(name, known, others) {
			continue
		}
		// Two edits for a long name, one for a short one: GPUPASS_FOO
		// is not a misspelt GPUPASS_TO.
		limit := 2
		if len(name)-len(Prefix) <= 5 {
			limit = 1
		}
		best, bestD := "", limit+1
		for k := range known {
			if d := distance(name, k); d < bestD || d == bestD && k < best {
				best, bestD = k, d
			}
		}
		if best != "" {
			warnings = append(warnings, fmt.Sprintf("%s is not a gpupass setting and is ignored; did you mean %s?", name, best))
		}
	}
	return warnings
}

// Unknown says whether environ holds a GPUPASS_* variable that Typos
// would look at: one not in known and not one of Others.
func Unknown(environ []string, known map[string]bool) bool {
	others := othersSet()
	for _, kv := range environ {
		if name, _, _ := strings.Cut(kv, "="); unknown(name, known, others) {
			return true
		}
	}
	return false
}

// othersSet is Others and the rendezvous variables every rank of a gang's
// job gets (GPUPASS_RANK, GPUPASS_MASTER_ADDR, …): a gpupass command run
// in such a job warns about none of them.
func othersSet() map[string]bool {
	others := map[string]bool{}
	for _, o := range Others {
		others[o] = true
	}
	for _, o := range rendezvous.Names() {
		others[o] = true
	}
	return others
}

// unknown is the one rule for which variables Typos considers.
func unknown(name string, known, others map[string]bool) bool {
	return strings.HasPrefix(name, Prefix) && !known[name] && !others[name] && !strings.HasPrefix(name, Prefix+"ALLOCATION_")
}

// distance is the edit distance of a and b, capped at 3 (all Typos
// needs).
func distance(a, b string) int {
	if d := len(a) - len(b); d > 2 || d < -2 {
		return 3
	}
	return min(editdist.Distance(a, b), 3)
}
