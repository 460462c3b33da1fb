package cli

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// EnvPrefix is the prefix of every environment variable gpupass reads for
// its flags: --broker-url is GPUPASS_BROKER_URL. This is the one place
// where flag and variable names are tied together.
const EnvPrefix = "GPUPASS_"

// EnvName returns the environment variable that sets a flag.
func EnvName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// secretFlags lists flags whose value is a secret. They also accept
// GPUPASS_<NAME>_FILE, and their values are never echoed.
var (
	secretMu    sync.RWMutex
	secretFlags = map[string]bool{}
)

// MarkSecret declares a flag as a secret (token, password). Call it from
// the options' AddFlags. Commands may be built concurrently (parallel
// tests each run Main), hence the lock.
func MarkSecret(flag string) {
	secretMu.Lock()
	secretFlags[flag] = true
	secretMu.Unlock()
}

func isSecret(flag string) bool {
	secretMu.RLock()
	defer secretMu.RUnlock()
	return secretFlags[flag]
}

// applyEnv sets every flag of cmd (and its parents' persistent flags) that
// was not given on the command line from its environment variable.
func applyEnv(cmd *cobra.Command, getenv func(string) string) error {
	var firstErr error
	set := func(f *pflag.Flag) {
		if f.Changed || firstErr != nil {
			return
		}
		name := EnvName(f.Name)
		v := getenv(name)
		if v == "" && isSecret(f.Name) {
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
			if isSecret(f.Name) {
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

// ApplyEnv sets cmd's unset flags from their GPUPASS_* variables. The other
// binaries (gpupass-broker) call it so every flag follows the same rule.
func ApplyEnv(cmd *cobra.Command) error { return applyEnv(cmd, os.Getenv) }
