package gpupass

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpupass/gpupass/internal/api"
	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/bytesize"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/termsafe"
	"github.com/gpupass/gpupass/internal/workdir"
)

// maxArchive is the broker's Submit limit less room for the rest.
const maxArchive = api.MaxSubmitBytes - 1<<20

// archiveDir packs a run's work dir (the demo's example) with
// workdir.Pack, and says which flag raises a limit it breaks.
func archiveDir(dir string, l workdir.Limits) ([]byte, error) {
	p, err := workdir.Pack(dir, workdir.PackOptions{Limits: l, MaxCompressed: maxArchive, StateDirs: stateDirs(os.Getenv)})
	if err != nil {
		return nil, limitHint(err)
	}
	return p.Archive, nil
}

// limitHint adds to a work dir limit error what to do about it.
func limitHint(err error) error {
	var fe *fielderr.Error
	if errors.As(err, &fe) && fe.Field == api.FieldSubmitWorkdir {
		// The broker's own limit, lower than this side's.
		return fmt.Errorf("%w: ship less (data from storage, not the work dir; a .gpupassignore leaves files out), or ask the broker's operator to raise it", err)
	}
	var le *workdir.LimitError
	if !errors.As(err, &le) {
		return err
	}
	return fmt.Errorf("%w: ship less (data from storage, not the work dir; a .gpupassignore leaves files out), or raise --workdir-max-%s (the broker's gpupass-broker serve --workdir-max-%s must allow it too)", err, le.Limit, le.Limit)
}

// stateDirs are the state dirs `up` uses here: the default one and the
// one its config names, so a work dir never ships them even where they
// lack workdir.StateMarker.
func stateDirs(getenv func(string) string) []string {
	if getenv == nil {
		getenv = os.Getenv
	}
	dirs := []string{DefaultStateDir(getenv)}
	if c, err := LoadLocalConfig(getenv); err == nil && c != nil && c.StateDir != "" {
		dirs = append(dirs, c.StateDir)
	}
	return dirs
}

// workdirHint adds to a refusal of secret-looking files the two fixes,
// as commands: a line each in the work dir's .gpupassignore, or (where
// the door has one) the include flag.
func workdirHint(err error, names fielderr.Names) error {
	var se *workdir.SecretsError
	if !errors.As(err, &se) {
		return err
	}
	dir := "."
	var fe *fielderr.Error
	if errors.As(err, &fe) && fe.Value != "" {
		dir = fe.Value
	}
	lines, incl := make([]string, 0, len(se.Files)), []string{}
	for _, f := range se.Files {
		lines = append(lines, termsafe.ShellQuote(workdir.IgnoreLine(f.Path)))
		incl = append(incl, names["WorkdirInclude"]+" "+termsafe.ShellQuote(f.Path))
	}
	msg := fmt.Sprintf("%v\nleave them out (they stay on this machine), then run the command again:\n  printf '\\n%%s\\n' %s >> %s", err,
		strings.Join(lines, " "), termsafe.ShellQuote(filepath.Join(dir, ".gpupassignore")))
	if names["WorkdirInclude"] != "" {
		msg += "\nor ship them on purpose: add " + strings.Join(incl, " ") + " to the command"
	}
	return &hinted{msg: msg, err: err}
}

type hinted struct {
	msg string
	err error
}

func (h *hinted) Error() string { return h.msg }
func (h *hinted) Unwrap() error { return h.err }

// workdirSummary is the one line train prints about the work dir it
// shipped.
func workdirSummary(w *apptrain.Workdir, names fielderr.Names) string {
	return summarize(w, "shipped", names)
}

func summarize(w *apptrain.Workdir, verb string, names fielderr.Names) string {
	s := fmt.Sprintf("work dir %s %s: %d files, %s (%s compressed)", w.Dir, verb, len(w.Files), bytesize.Format(w.Bytes), bytesize.Format(int64(len(w.Archive))))
	if n := len(w.Left); n > 0 {
		s += fmt.Sprintf("; %d left out", n)
		if names["Workdir"] == "--workdir" {
			s += " (--list-workdir names them and why)"
		}
	}
	return s
}

// ListWorkdir prints what train would ship, and what it leaves out by
// which rule, without submitting.
func ListWorkdir(o *TrainOptions, out io.Writer) error {
	opts := o.options()
	w, err := apptrain.PackWorkdir(opts)
	if err != nil {
		return workdirHint(limitHint(trainFlagNames.Apply(err)), trainFlagNames)
	}
	v := workdirList{Files: []string{}, LeftOut: []workdir.LeftOut{}, w: w}
	if w != nil {
		n := len(w.Archive)
		v = workdirList{Bytes: &w.Bytes, CompressedBytes: &n, Dir: &w.Dir, Files: w.Files, LeftOut: w.Left, w: w}
	}
	return output.Write(out, o.Global.format(), v)
}

// workdirList is what --list-workdir prints: with no work dir (nil w),
// only a null dir and empty lists (JSON keys in the order they have
// always had).
type workdirList struct {
	Bytes           *int64            `json:"bytes,omitempty"`
	CompressedBytes *int              `json:"compressed_bytes,omitempty"`
	Dir             *string           `json:"dir"`
	Files           []string          `json:"files"`
	LeftOut         []workdir.LeftOut `json:"left_out"`

	w *apptrain.Workdir
}

func (l workdirList) WriteText(out io.Writer) error {
	w := l.w
	if w == nil {
		_, err := fmt.Fprintln(out, "no work dir is shipped (--no-workdir)")
		return err
	}
	fmt.Fprintln(out, summarize(w, "would ship", fielderr.Names{}))
	for _, f := range w.Files {
		fmt.Fprintf(out, "ship  %s\n", f)
	}
	for _, l := range w.Left {
		fmt.Fprintf(out, "skip  %s  (%s)\n", l.Path, l.Rule)
	}
	return nil
}
