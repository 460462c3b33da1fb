// Package flagenv ties every gpupass flag to an environment variable:
// --broker-url is GPUPASS_BROKER_URL, and a secret flag also reads
// GPUPASS_<FLAG>_FILE. All three binaries use it, so the rule is written
// once; it imports only cobra/pflag (the agent may use it).
package flagenv

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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

// Apply sets every flag of cmd (and its inherited persistent flags) that
// was not given on the command line from its environment variable.
func Apply(cmd *cobra.Command, getenv func(string) string) error {
	var firstErr error
	set := func(f *pflag.Flag) {
		if f.Changed || firstErr != nil {
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
			if secret {
				firstErr = fmt.Errorf("invalid value in %s", name)
			} else {
				firstErr = fmt.Errorf("invalid value %q in %s: %w", v, name, err)
			}
			return
		}
		f.Changed = true
	}
	cmd.Flags().VisitAll(set)
	cmd.InheritedFlags().VisitAll(set)
	return firstErr
}
