// Package flagalias keeps an old short flag working after it was given to
// another flag, for the scripts and fingers that still type it: `-f` was
// --spec in validate and bundle but --follow in logs, and is --follow
// everywhere now, with --spec as -s.
//
// A flag has one shorthand in pflag, so the old one is a hidden flag that
// shares the target's value. It marks the target as set, so the flag's
// GPUPASS_* variable does not override what was typed, and it prints its
// note itself: pflag's own deprecation notes go through cobra's Print,
// which may be stdout, where --output json promises JSON only.
package flagalias

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

// Shorthand registers -short as a deprecated spelling of the flag name in
// fs (which must already hold it). Each use prints
// "-short is deprecated: use -new/--name" to errOut().
func Shorthand(fs *pflag.FlagSet, name, short string, errOut func() io.Writer) {
	target := fs.Lookup(name)
	if target == nil {
		panic("flagalias: no flag --" + name)
	}
	use := "--" + name
	if target.Shorthand != "" {
		use = "-" + target.Shorthand + " or --" + name
	}
	v := &alias{target: target, errOut: errOut, note: fmt.Sprintf("-%s for --%s is deprecated and will be removed: use %s", short, name, use)}
	f := fs.VarPF(v, "deprecated-"+short+"-"+name, short, "deprecated: use "+use)
	f.Hidden = true
	f.NoOptDefVal = target.NoOptDefVal
}

type alias struct {
	target *pflag.Flag
	errOut func() io.Writer
	note   string
}

func (a *alias) Set(s string) error {
	if err := a.target.Value.Set(s); err != nil {
		return err
	}
	a.target.Changed = true
	if a.errOut != nil {
		fmt.Fprintf(a.errOut(), "warning: %s\n", a.note)
	}
	return nil
}

func (a *alias) String() string { return a.target.Value.String() }
func (a *alias) Type() string   { return a.target.Value.Type() }
