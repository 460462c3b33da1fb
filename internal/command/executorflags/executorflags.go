// Package executorflags carries the agent's executors' flags, as data,
// to gpupass up, which starts agents with them but does not link the
// executors (client-go alone would double gpupass's size and its start).
// gpupass-docs writes executors.json from the agent's registered backends
// (`make docs`), its test fails when the file is stale, and gpupass
// embeds it: a flag an executor adds is one up takes, with no edit to up.
// It imports only pflag and flagenv.
package executorflags

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/command/flagenv"
)

// File is the list's path from the repository root.
const File = "internal/command/executorflags/executors.json"

// Executor is one --executor value of gpupass-agent and its flags.
type Executor struct {
	Name  string `json:"name"`
	Usage string `json:"usage"`
	// StandsFor, when set, is what one agent stands for: a stack has
	// one agent per region.
	StandsFor string `json:"stands_for,omitempty"`
	Flags     []Flag `json:"flags,omitempty"`
}

// Flag is one of an executor's flags, as gpupass-agent defines it.
type Flag struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Default string `json:"default"`
	Usage   string `json:"usage"`
	Env     string `json:"env"`
	// Stack, when set, is the value a gpupass up stack's agents get
	// unless the flag is set.
	Stack string `json:"stack,omitempty"`
}

// Describe is the data of one executor: its flags as it registers them
// in fs, and the stack's defaults for them.
func Describe(name, usage, standsFor string, fs *pflag.FlagSet, stack map[string]string) (Executor, error) {
	e := Executor{Name: name, Usage: usage, StandsFor: standsFor}
	fs.VisitAll(func(f *pflag.Flag) {
		e.Flags = append(e.Flags, Flag{Name: f.Name, Type: f.Value.Type(), Default: f.DefValue, Usage: f.Usage, Env: flagenv.Name(f.Name), Stack: stack[f.Name]})
	})
	for n := range stack {
		if fs.Lookup(n) == nil {
			return e, fmt.Errorf("executor %s: stack default for --%s, which it does not have", name, n)
		}
	}
	return e, nil
}

// Marshal is the list as executors.json holds it.
func Marshal(es []Executor) ([]byte, error) {
	b, err := json.MarshalIndent(es, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

//go:embed executors.json
var embedded []byte

var registered = sync.OnceValues(func() ([]Executor, error) { return Parse(embedded) })

// Registered is the list gpupass was built with (executors.json).
func Registered() ([]Executor, error) { return registered() }

// Parse reads a list as Marshal writes it.
func Parse(b []byte) ([]Executor, error) {
	var es []Executor
	if err := json.Unmarshal(b, &es); err != nil {
		return nil, fmt.Errorf("%s: %w", File, err)
	}
	return es, nil
}

// AddFlags registers e's flags in fs with their types, usage and
// defaults (the stack's, where set).
func (e Executor) AddFlags(fs *pflag.FlagSet) error {
	for _, fl := range e.Flags {
		if fs.Lookup(fl.Name) != nil {
			return fmt.Errorf("%s: executor %s's --%s is a flag of gpupass up's own already: rename it in the executor", File, e.Name, fl.Name)
		}
		def := fl.Default
		if fl.Stack != "" {
			def = fl.Stack
		}
		switch fl.Type {
		case "string":
			fs.String(fl.Name, "", fl.Usage)
		case "stringSlice":
			fs.StringSlice(fl.Name, nil, fl.Usage)
		case "stringArray":
			fs.StringArray(fl.Name, nil, fl.Usage)
		case "bool":
			fs.Bool(fl.Name, false, fl.Usage)
		case "int":
			fs.Int(fl.Name, 0, fl.Usage)
		case "duration":
			fs.Duration(fl.Name, 0, fl.Usage)
		default:
			return fmt.Errorf("%s: executor %s's --%s has type %q, which gpupass up cannot hold: regenerate it with make docs, or teach executorflags the type", File, e.Name, fl.Name, fl.Type)
		}
		f := fs.Lookup(fl.Name)
		if v := strings.TrimSuffix(strings.TrimPrefix(def, "["), "]"); v != "" {
			// Value.Set, not fs.Set: a default leaves the flag unchanged.
			if err := f.Value.Set(v); err != nil {
				return fmt.Errorf("%s: executor %s's --%s default %q: %w", File, e.Name, fl.Name, def, err)
			}
		}
		f.DefValue = f.Value.String()
	}
	return nil
}

// Args are e's flags as gpupass-agent arguments: each flag set in fs,
// and the stack's default of each one that is not.
func (e Executor) Args(fs *pflag.FlagSet) []string {
	var args []string
	for _, fl := range e.Flags {
		f := fs.Lookup(fl.Name)
		switch {
		case f == nil:
		case f.Changed:
			if sv, ok := f.Value.(pflag.SliceValue); ok {
				for _, v := range sv.GetSlice() {
					args = append(args, "--"+fl.Name+"="+v)
				}
				continue
			}
			args = append(args, "--"+fl.Name+"="+f.Value.String())
		case fl.Stack != "":
			args = append(args, "--"+fl.Name+"="+fl.Stack)
		}
	}
	return args
}
