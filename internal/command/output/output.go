// Package output is the one place gpupass's binaries decide how a command's
// result is printed: the -o/--output flag (with GPUPASS_OUTPUT), which
// formats a command accepts, and how each format is written. A command
// returns a typed result that can write itself as text (Texter); JSON is
// encoded here, so another format is one change in this file. It imports
// only cobra/pflag, flagenv and termsafe (the agent links it).
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// Format is a value of -o/--output.
type Format string

// The formats. GitHub and GitLab are for CI steps (annotations, job
// summaries, reports), SARIF 2.1.0 for code scanning: only the commands
// that declare them (Supports) accept them.
const (
	Text   Format = "text"
	JSON   Format = "json"
	GitHub Format = "github"
	GitLab Format = "gitlab"
	SARIF  Format = "sarif"
)

// all is every Format, in the order help and errors name them.
var all = []Format{Text, JSON, GitHub, GitLab, SARIF}

// defaults is what a command accepts unless it declares otherwise.
var defaults = []Format{Text, JSON}

// CI reports whether f is a CI system's format (GitHub, GitLab).
func (f Format) CI() bool { return f == GitHub || f == GitLab }

// Document reports whether f prints one document a program reads (JSON,
// SARIF): what a command has for people goes to stderr instead.
func (f Format) Document() bool { return f == JSON || f == SARIF }

// String implements pflag.Value.
func (f *Format) String() string { return string(*f) }

// Set implements pflag.Value. Any value is kept: what a command accepts
// depends on the command, and Check (which knows it) refuses the rest
// with the list.
func (f *Format) Set(s string) error {
	*f = Format(s)
	return nil
}

// Type implements pflag.Value ("string", as the help has always said).
func (f *Format) Type() string { return "string" }

// Flag is the flag's name; its variable is flagenv's GPUPASS_OUTPUT.
const Flag = "output"

// Register adds -o/--output, persistent, to root (the root of a binary),
// bound to f, default text, with shell completion of the values the
// command being completed accepts. The binary's PersistentPreRunE calls
// Check after flagenv.Apply.
func Register(root *cobra.Command, f *Format) {
	*f = Text
	root.PersistentFlags().VarP(f, Flag, "o", "output format: text or json")
	_ = root.RegisterFlagCompletionFunc(Flag, func(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
		var vals []string
		for _, v := range Supported(cmd) {
			vals = append(vals, string(v))
		}
		return vals, cobra.ShellCompDirectiveNoFileComp
	})
}

// Annotations on a command: the formats it accepts, and the flag that
// writes its file (see WritesFileWith).
const (
	formatsAnnotation = "gpupass-output-formats"
	fileAnnotation    = "gpupass-output-file-flag"
)

// Supports declares the formats cmd accepts (its subcommands inherit
// them unless they declare their own). Without it a command accepts text
// and json.
func Supports(cmd *cobra.Command, formats ...Format) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	s := make([]string, len(formats))
	for i, f := range formats {
		s[i] = string(f)
	}
	cmd.Annotations[formatsAnnotation] = strings.Join(s, ",")
}

// WritesFileWith declares that cmd writes what (say "the zip") to the
// path its flag --flag names: a path given to -o is then refused with
// that flag as the fix (-o means the format everywhere).
func WritesFileWith(cmd *cobra.Command, flag, what string) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[fileAnnotation] = flag + "," + what
}

// Supported is the formats cmd accepts: its own declaration, else its
// nearest parent's, else text and json.
func Supported(cmd *cobra.Command) []Format {
	for c := cmd; c != nil; c = c.Parent() {
		if a, ok := c.Annotations[formatsAnnotation]; ok {
			var fs []Format
			for _, s := range strings.Split(a, ",") {
				fs = append(fs, Format(s))
			}
			return fs
		}
	}
	return slices.Clone(defaults)
}

// aliasAnnotation names a command's deprecated spelling of -o (Alias).
const aliasAnnotation = "gpupass-output-alias"

// Alias registers --name on cmd as a deprecated spelling of -o that
// scripts still type (validate's --format, from before its formats were
// -o's): Check makes its value the command's format, with a note on
// stderr naming -o. It sets GPUPASS_<NAME> too, as flags do.
func Alias(cmd *cobra.Command, name, usage string) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[aliasAnnotation] = name
	var v Format
	cmd.Flags().Var(&v, name, usage)
	_ = cmd.Flags().MarkHidden(name)
}

// Check refuses a format cmd does not accept, naming the flag, the value
// and the accepted values; the binaries call it before a command runs. A
// deprecated alias (Alias) given becomes the format here; beside a -o of
// another value it is refused.
func Check(cmd *cobra.Command) error {
	f, ok := of(cmd)
	if !ok {
		return nil
	}
	if name := cmd.Annotations[aliasAnnotation]; name != "" {
		if a := cmd.Flags().Lookup(name); a != nil && a.Changed {
			v := Format(a.Value.String())
			if ok := Supported(cmd); !slices.Contains(ok, v) {
				return fmt.Errorf("--%s %q (or %s): must be %s; --%s is deprecated: use -o", name, string(v), flagenv.Name(name), orFormats(ok), name)
			}
			if o := cmd.Flag(Flag); o.Changed && f != v {
				return fmt.Errorf("--%s %s with --output %s: --%s is the old name of --output; give -o %s alone", name, termsafe.String(string(v)), termsafe.String(string(f)), name, termsafe.String(string(v)))
			}
			if err := cmd.Flag(Flag).Value.Set(string(v)); err != nil {
				return err
			}
			f = v
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: warning: --%s is deprecated: use -o %s\n", cmd.Root().Name(), name, termsafe.ShellQuote(string(v)))
		}
	}
	return check(cmd, f)
}

// Of is the format cmd's -o/--output (its own or inherited) holds: Text
// when it has none, or before the flags are parsed.
func Of(cmd *cobra.Command) Format {
	if f, ok := of(cmd); ok {
		return f
	}
	return Text
}

func of(cmd *cobra.Command) (Format, bool) {
	fl := cmd.Flag(Flag)
	if fl == nil {
		return "", false
	}
	f, ok := fl.Value.(*Format)
	if !ok {
		return "", false
	}
	return *f, true
}

func check(cmd *cobra.Command, f Format) error {
	ok := Supported(cmd)
	if slices.Contains(ok, f) {
		return nil
	}
	accepted := orFormats(ok)
	if !slices.Contains(all, f) {
		// A path, as -o means to many tools that write a file: the fix
		// names the flag that does, quoted to paste (a value a terminal
		// could act on gets the plain refusal, escaped).
		if a := cmd.Annotations[fileAnnotation]; a != "" && termsafe.String(string(f)) == string(f) {
			flag, what, _ := strings.Cut(a, ",")
			p := termsafe.ShellQuote(string(f))
			return fmt.Errorf("-o %s: --output is the output format (%s); write %s with --%s %s", p, accepted, what, flag, p)
		}
		return fmt.Errorf("--output %q (or %s): must be %s", string(f), flagenv.Name(Flag), accepted)
	}
	return fmt.Errorf("--output %s: %s prints %s", f, cmd.CommandPath(), accepted)
}

// orFormats is fs as "text or json", "text, json or github".
func orFormats(fs []Format) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = string(f)
	}
	return orList(names)
}

// orList is "a or b", "a, b or c".
func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Texter is a result that writes itself as text (the default format).
type Texter interface {
	WriteText(w io.Writer) error
}

// SARIFWriter is a result that has a SARIF 2.1.0 form (validate's
// findings), for the commands that declare SARIF.
type SARIFWriter interface {
	WriteSARIF(w io.Writer) error
}

// JSONWriter is a result whose JSON is not the house form and writes it
// itself: a signed report printed as the bytes that were signed, a line
// per API message, or the compact documents some commands have always
// printed (scripts read them as they are).
type JSONWriter interface {
	WriteJSON(w io.Writer) error
}

// Write prints v in format f: JSON in the house form (WriteJSON), text
// through v's WriteText. A CI format prints the text too: it is what the
// job's log shows, and the command adds the CI's own channels (step
// outputs, summary, annotations) beside it. A format with no writer here
// is an error, not silence: Check keeps those from reaching a command.
func Write(w io.Writer, f Format, v any) error {
	switch f {
	case JSON:
		if j, ok := v.(JSONWriter); ok {
			return j.WriteJSON(w)
		}
		return WriteJSON(w, v)
	case Text, GitHub, GitLab, "":
		t, ok := v.(Texter)
		if !ok {
			return fmt.Errorf("output: %T has no text form", v)
		}
		return t.WriteText(w)
	case SARIF:
		if s, ok := v.(SARIFWriter); ok {
			return s.WriteSARIF(w)
		}
	}
	return fmt.Errorf("--output %s: this command does not print that format", f)
}

// WriteJSON prints v as the one JSON document of a command's --output
// json: two-space indents, no HTML escaping (names and reasons come from
// users and jobs and are printed as they are), a trailing newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// WriteCompactJSON prints v on one line, as json.Encoder does by default
// (HTML escaped): the form of the documents that have always been
// compact (gpupass version, gpupass up, gpupass-broker token), for their
// JSONWriter.
func WriteCompactJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}
