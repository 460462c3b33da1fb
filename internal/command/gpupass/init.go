package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/examples"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/fsutil"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// InitOptions are the flags of `gpupass init`.
type InitOptions struct {
	Global *GlobalOptions
	// Dir is where the starter project is written.
	Dir string
	// Name is the spec's name; empty: derived from Dir.
	Name string
	// Force overwrites existing files.
	Force bool
}

// AddFlags registers init's flags.
func (o *InitOptions) AddFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.Name, "name", "", "name of the job in gpupass.yaml (default: the directory's name)")
	cmd.Flags().BoolVar(&o.Force, "force", false, "overwrite files that already exist")
}

func newInitCmd(g *GlobalOptions) *cobra.Command {
	o := &InitOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "init [DIR]",
		Short: "Write a starter gpupass.yaml, training script and README snippet",
		Long: `Write a valid starter spec (gpupass.yaml), a small training script (train.py)
and a README snippet (GPUPASS.md) into DIR (default: the working directory).
Existing files are left alone (and named) unless --force is given; the
others are written.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Dir = "."
			if len(args) == 1 {
				o.Dir = args[0]
			}
			return RunInit(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	return cmd
}

var (
	starterName = "name: my-training-job"
	nameUnsafe  = regexp.MustCompile(`[^a-z0-9]+`)
)

// jobName makes a spec name from a directory name: lowercase letters,
// digits and dashes.
func jobName(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "my-training-job"
	}
	n := strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(filepath.Base(abs)), "-"), "-")
	if n == "" {
		return "my-training-job"
	}
	return n
}

// RunInit writes the starter project: every file that does not exist yet
// (all of them with Force).
func RunInit(_ context.Context, o *InitOptions, out io.Writer) error {
	name := o.Name
	if name == "" {
		name = jobName(o.Dir)
	}
	if strings.ContainsAny(name, "\n\r\"'#:") {
		return fmt.Errorf("--name %q: use letters, digits and dashes", name)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", o.Dir, err)
	}
	type file struct {
		dst  string
		body []byte
	}
	var files []file
	kept := []string{}
	for _, e := range examples.Starter {
		body, err := fs.ReadFile(examples.Files, e.Path)
		if err != nil {
			return fmt.Errorf("reading the embedded starter: %w", err)
		}
		if e.Name == "gpupass.yaml" {
			body = []byte(strings.Replace(string(body), starterName, "name: "+name, 1))
		}
		dst := filepath.Join(o.Dir, e.Name)
		if !o.Force {
			// As the help says: an existing file is left alone (it may be
			// the user's own train.py) and the others are still written.
			if _, err := os.Lstat(dst); err == nil {
				kept = append(kept, dst)
				continue
			} else if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("checking %s: %w", dst, err)
			}
		}
		files = append(files, file{dst, body})
	}
	written := []string{}
	for _, f := range files {
		if err := fsutil.WriteFileAtomic(f.dst, f.body, 0o644); err != nil {
			return err
		}
		written = append(written, f.dst)
	}
	gitignore := filepath.Join(o.Dir, ".gitignore")
	created, added, err := ignoreStateDir(gitignore)
	if err != nil {
		return err
	}
	if created {
		written = append(written, gitignore)
	}
	return output.Write(out, o.Global.format(), initResult{Dir: o.Dir, Files: written, GitignoreAdded: added, Kept: kept, Name: name,
		gitignore: gitignore, gitignoreCreated: created})
}

// initResult is what init prints (JSON keys in the order they have
// always had).
type initResult struct {
	Dir            string   `json:"dir"`
	Files          []string `json:"files"`
	GitignoreAdded bool     `json:"gitignore_added"`
	Kept           []string `json:"kept"`
	Name           string   `json:"name"`

	gitignore        string
	gitignoreCreated bool
}

func (r initResult) WriteText(out io.Writer) error {
	for _, w := range r.Files {
		fmt.Fprintf(out, "wrote %s\n", w)
	}
	if r.gitignoreCreated || r.GitignoreAdded {
		fmt.Fprintf(out, "  (%s keeps %s, up's state dir with its database and tokens, out of git)\n", r.gitignore, stateIgnore)
	}
	for _, k := range r.Kept {
		fmt.Fprintf(out, "kept %s (it exists; --force overwrites it)\n", k)
	}
	next := "gpupass validate"
	if filepath.Clean(r.Dir) != "." {
		next = "cd " + termsafe.ShellQuote(r.Dir) + " && " + next
	}
	_, err := fmt.Fprintf(out, "\nNext: %s\n", next)
	return err
}

// stateIgnore is the .gitignore line that keeps `gpupass up`'s default
// state dir (broker database, tokens, agents' state) out of git.
const stateIgnore = ".gpupass/"

// ignoreStateDir makes sure the .gitignore at path keeps the state dir
// out of git: it writes the file when there is none, else appends the
// line when no line names the state dir already; the user's rules stay.
func ignoreStateDir(path string) (created, added bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		body := "# gpupass up's state dir: broker database, tokens, agents' state\n" + stateIgnore + "\n"
		if err := fsutil.WriteFileAtomic(path, []byte(body), 0o644); err != nil {
			return false, false, err
		}
		return true, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("reading %s: %w", path, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		switch strings.TrimSpace(l) {
		case ".gpupass", ".gpupass/", "/.gpupass", "/.gpupass/":
			return false, false, nil
		}
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	b = append(b, stateIgnore+"\n"...)
	if err := fsutil.WriteFileAtomic(path, b, 0o644); err != nil {
		return false, false, err
	}
	return false, true, nil
}
