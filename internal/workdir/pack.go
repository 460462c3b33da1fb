package workdir

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// StateMarker is the file `gpupass up` writes into its state dir, so that
// Pack knows the dir wherever it is and whatever it is called.
const StateMarker = ".gpupass-state"

// StateDirName is the state dir's default name (in the directory `gpupass
// up` runs in); a directory of that name is never shipped either, for a
// state dir written before StateMarker was.
const StateDirName = ".gpupass"

// TooLargeError is an archive that packs to more than the compressed size
// allowed (the broker's request limit, less room for the rest of a
// Submit).
type TooLargeError struct{ MaxBytes int }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("more than %d MiB compressed; ship less (data from storage, not the work dir; a .gpupassignore leaves files out)", e.MaxBytes>>20)
}

// Secret is a file that looks like a key or credential.
type Secret struct {
	Path string // slash-separated, relative to the work dir
	Why  string
}

// SecretsError names every file Pack refused because it looks like a
// secret and was not in PackOptions.Include.
type SecretsError struct{ Files []Secret }

func (e *SecretsError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d file(s) look like secrets and are not shipped:", len(e.Files))
	for i, f := range e.Files {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s (%s)", f.Path, f.Why)
	}
	return b.String()
}

// Paths returns the refused files' paths.
func (e *SecretsError) Paths() []string {
	var p []string
	for _, f := range e.Files {
		p = append(p, f.Path)
	}
	return p
}

// IncludeError is an Include entry that names no file Pack would refuse
// as a secret: a typo, or a file an ignore rule leaves out anyway.
type IncludeError struct{ Path string }

func (e *IncludeError) Error() string {
	return fmt.Sprintf("%s is not a secret-looking file of the work dir (none there, or an ignore rule leaves it out)", e.Path)
}

// PackOptions say what Pack ships.
type PackOptions struct {
	Limits Limits
	// MaxCompressed is the most bytes the archive may weigh (0: no limit).
	MaxCompressed int
	// Include names files (relative to the work dir) that look like
	// secrets and are shipped all the same.
	Include []string
	// StateDirs are never shipped, whatever the ignore files say: gpupass
	// state dirs (broker database, tokens, agents' work dirs) known by
	// path, besides any holding StateMarker.
	StateDirs []string
}

// LeftOut is an entry Pack did not ship, and the rule that left it out.
type LeftOut struct {
	Path string `json:"path"` // slash-separated, relative; a directory ends in /
	Rule string `json:"rule"`
}

// Packed is a packed work dir and what went into it.
type Packed struct {
	Archive []byte
	// Files are the paths of the files shipped, in walk order.
	Files []string
	Dirs  int
	Bytes int64 // file content, uncompressed
	Left  []LeftOut
}

// Pack packs a run's work dir as a gzip tar of regular files and
// directories. Left out, each with the rule that left it out: .git and
// __pycache__ (history is not the run's, and bytecode is rebuilt for the
// node's Python), gpupass state dirs, and whatever the .gitignore and
// .gpupassignore files of the dir and its sub directories ignore. Files
// that look like keys or credentials are refused (a *SecretsError naming
// them all) unless named in o.Include. Links are refused rather than
// followed out of dir. The limits (entries, depth, bytes, path length)
// are checked as it goes, so a directory the broker would refuse fails
// here, early, with a *LimitError; more than o.MaxCompressed bytes of
// archive is a *TooLargeError.
func Pack(dir string, o PackOptions) (*Packed, error) {
	p, err := pack(dir, o)
	if err != nil {
		return nil, fmt.Errorf("packing %s: %w", dir, err)
	}
	return p, nil
}

func pack(dir string, o PackOptions) (*Packed, error) {
	include, err := includes(dir, o.Include)
	if err != nil {
		return nil, err
	}
	var states []os.FileInfo
	for _, s := range o.StateDirs {
		if fi, err := os.Stat(s); err == nil {
			states = append(states, fi)
		}
	}
	isState := func(path string, d fs.DirEntry) bool {
		if d.Name() == StateDirName {
			return true
		}
		if _, err := os.Lstat(filepath.Join(path, StateMarker)); err == nil {
			return true
		}
		fi, err := d.Info()
		if err != nil {
			return false
		}
		return slices.ContainsFunc(states, func(s os.FileInfo) bool { return os.SameFile(s, fi) })
	}

	out := &Packed{}
	var secrets []Secret
	ig := &Ignore{}
	count := NewCounter(o.Limits)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	readIgnores := func(path, rel string) error {
		for _, name := range IgnoreFiles {
			b, err := os.ReadFile(filepath.Join(path, name))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			ig.Add(rel, name, b)
		}
		return nil
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return readIgnores(path, "")
		}
		rel = filepath.ToSlash(rel)
		leave := func(rule string) error {
			if d.IsDir() {
				out.Left = append(out.Left, LeftOut{rel + "/", rule})
				return filepath.SkipDir
			}
			out.Left = append(out.Left, LeftOut{rel, rule})
			return nil
		}
		switch {
		case d.IsDir() && (d.Name() == ".git" || d.Name() == "__pycache__"):
			return leave("always (" + d.Name() + ")")
		case d.IsDir() && isState(path, d):
			return leave("always (a gpupass state dir: database, tokens, agents' state)")
		}
		if ignored, rule := ig.Match(rel, d.IsDir()); ignored {
			return leave(rule)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !d.IsDir() && !info.Mode().IsRegular() {
			return fmt.Errorf("%s: only regular files and directories can be shipped (links and devices cannot; a .gpupassignore line leaves it out)", path)
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = rel
		if d.IsDir() {
			if err := count.Add(hdr.Name, 0); err != nil {
				return err
			}
			out.Dirs++
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			return readIgnores(path, rel)
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		head := make([]byte, min(hdr.Size, secretHead))
		if _, err := io.ReadFull(f, head); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return shrank(path, hdr.Size)
			}
			return err
		}
		if why := secretName(rel); why != "" || secretContent(rel, head) != "" {
			if why == "" {
				why = secretContent(rel, head)
			}
			if !include[rel] {
				secrets = append(secrets, Secret{rel, why})
				return nil
			}
			delete(include, rel)
		}
		if err := count.Add(hdr.Name, hdr.Size); err != nil {
			return err
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		// The header holds the size seen a moment ago; a file another
		// process writes meanwhile (a log, a CI job's output next door) is
		// shipped as it was then, and one that shrank is refused.
		if _, err := tw.Write(head); err != nil {
			return err
		}
		n, err := io.Copy(tw, io.LimitReader(f, hdr.Size-int64(len(head))))
		if err != nil {
			return err
		}
		if int64(len(head))+n < hdr.Size {
			return shrank(path, hdr.Size)
		}
		out.Files = append(out.Files, rel)
		out.Bytes += hdr.Size
		if o.MaxCompressed > 0 && buf.Len() > o.MaxCompressed {
			return &TooLargeError{MaxBytes: o.MaxCompressed}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		return nil, err
	}
	if len(secrets) > 0 {
		return nil, &SecretsError{Files: secrets}
	}
	if left := slices.Sorted(maps.Keys(include)); len(left) > 0 {
		return nil, &IncludeError{Path: left[0]}
	}
	out.Archive = buf.Bytes()
	return out, nil
}

func shrank(path string, size int64) error {
	return fmt.Errorf("%s shrank from %d bytes while it was packed: stop what writes to it, or ship a directory nothing writes to", path, size)
}

// includes turns Include entries into paths relative to dir: as given
// when they name a file there, else resolved from the working directory
// when that lands inside dir (`--workdir proj --include proj/tls.pem`).
func includes(dir string, in []string) (map[string]bool, error) {
	m := map[string]bool{}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for _, p := range in {
		rel := filepath.Clean(p)
		if _, err := os.Lstat(filepath.Join(dir, rel)); err != nil || filepath.IsAbs(p) {
			abs, aerr := filepath.Abs(p)
			if aerr != nil {
				return nil, aerr
			}
			if r, rerr := filepath.Rel(absDir, abs); rerr == nil && r != ".." && !strings.HasPrefix(r, ".."+string(filepath.Separator)) {
				rel = r
			}
		}
		m[filepath.ToSlash(rel)] = true
	}
	return m, nil
}
