package wheel

import (
	"archive/zip"
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"

	"github.com/klauspost/compress/flate"

	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/wheel/coremeta"
)

// Scheme is where a wheel's files go (the install scheme of the target
// environment, as sysconfig.get_paths() of its interpreter says).
type Scheme struct {
	Purelib, Platlib, Scripts, Data string
	// Headers is the directory that holds one directory of headers per
	// distribution (pip: {prefix}/include/site/pythonX.Y).
	Headers string
	// Python is what a script's "#!python" line and an entry point's
	// wrapper start.
	Python string
}

// Installer unpacks wheels into an environment the way an installer
// does (PEP 427 "Installing a wheel"), without running any of their code:
// no pip, no build hook, no .pth file, no byte-compilation. The node
// agent uses it so that installing a bundle starts no interpreter over
// the bundle's files. It never overwrites a file it did not write itself
// (the environment's own bin/python, say); a later wheel of the same
// Installer may replace an earlier one's file, as pip lets namespace
// packages share an __init__.py.
type Installer struct {
	Scheme  Scheme
	written map[string]bool
}

// Installed is what one wheel put into the environment.
type Installed struct {
	Name, Version string
	// DistInfo is the installed .dist-info directory.
	DistInfo string
	// Files are every file written, RECORD included, absolute.
	Files []string
	// StartupHooks are the files that Python runs at interpreter start
	// in this environment: *.pth files at the top of site-packages and
	// the sitecustomize/usercustomize modules.
	StartupHooks []string
}

var (
	entryNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)
	entryRefRe  = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?::([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*))?(?:\s*\[[A-Za-z0-9_,.\s-]*\])?$`)
)

// Install verifies the wheel at p (Inspect's checks) and unpacks it.
func (in *Installer) Install(p string, f Filename) (*Installed, error) {
	fh, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("wheel %s: %w", f.File, err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("wheel %s: %w", f.File, err)
	}
	zr, err := openZip(fh, st.Size(), f, -1)
	if err != nil {
		return nil, err
	}
	// One pass: names and the RECORD's list are checked first (as
	// verify does), each file's hash as it is written; a wheel that fails
	// leaves a partial environment that the caller discards.
	zr.RegisterDecompressor(zip.Deflate, func(r io.Reader) io.ReadCloser { return flate.NewReader(r) })
	files := map[string]*zip.File{}
	var record *zip.File
	for _, zf := range zr.File {
		if err := checkName(zf, f); err != nil {
			return nil, err
		}
		if _, dup := files[zf.Name]; dup {
			return nil, fmt.Errorf("wheel %s: entry %q appears twice in the archive", f.File, zf.Name)
		}
		files[zf.Name] = zf
		if isRecordName(zf.Name, f) {
			if record != nil {
				return nil, fmt.Errorf("wheel %s: more than one .dist-info/RECORD", f.File)
			}
			record = zf
		}
	}
	if record == nil {
		return nil, fmt.Errorf("wheel %s: no %s-%s.dist-info/RECORD (not a valid wheel)", f.File, f.Distribution, f.Version)
	}
	distInfo := strings.TrimSuffix(record.Name, "/RECORD")
	rb, err := readAll(record)
	if err != nil {
		return nil, fmt.Errorf("wheel %s: %s: %w", f.File, record.Name, err)
	}
	entries, err := parseRecord(rb)
	if err != nil {
		return nil, fmt.Errorf("wheel %s: %s: %w", f.File, record.Name, err)
	}
	if err := checkRecord(f, files, record, entries, func(_ *zip.File, e recordEntry) error {
		_, err := recordHash(e.algo)
		return err
	}); err != nil {
		return nil, err
	}
	meta, err := readEntry(files, distInfo+"/WHEEL")
	if err != nil {
		return nil, fmt.Errorf("wheel %s: %w", f.File, err)
	}
	hdr := coremeta.Headers(meta)
	if v := hdr["Wheel-Version"]; !strings.HasPrefix(v, "1.") {
		return nil, fmt.Errorf("wheel %s: %s/WHEEL has Wheel-Version %q; only 1.x installs", f.File, distInfo, v)
	}
	root := in.Scheme.Platlib
	if strings.EqualFold(hdr["Root-Is-Purelib"], "true") {
		root = in.Scheme.Purelib
	}
	md, err := readEntry(files, distInfo+"/METADATA")
	if err != nil {
		return nil, fmt.Errorf("wheel %s: %w", f.File, err)
	}
	mh := coremeta.Headers(md)
	out := &Installed{Name: mh["Name"], Version: mh["Version"], DistInfo: filepath.Join(root, filepath.FromSlash(distInfo))}
	same, err := spec.PinMatches(f.Version, out.Version)
	if err != nil {
		return nil, fmt.Errorf("wheel %s: %s/METADATA: %w", f.File, distInfo, err)
	}
	if NormalizeName(out.Name) != f.Name() || !same {
		return nil, fmt.Errorf("wheel %s: METADATA names %s %s, not what the file name says", f.File, out.Name, out.Version)
	}
	dataDir := strings.TrimSuffix(distInfo, ".dist-info") + ".data/"
	type row struct{ rel, hash, size string }
	var rows []row
	addRow := func(abs, sum string, n int64) error {
		rel, err := filepath.Rel(root, abs)
		if err != nil {
			return err
		}
		rows = append(rows, row{filepath.ToSlash(rel), "sha256=" + sum, fmt.Sprint(n)})
		out.Files = append(out.Files, abs)
		return nil
	}
	addFile := func(abs string, b []byte) error {
		sum := sha256.Sum256(b)
		return addRow(abs, base64.RawURLEncoding.EncodeToString(sum[:]), int64(len(b)))
	}
	for _, zf := range zr.File {
		name := zf.Name
		if strings.HasSuffix(name, "/") || name == distInfo+"/RECORD" || name == distInfo+"/RECORD.jws" || name == distInfo+"/RECORD.p7s" || name == distInfo+"/INSTALLER" {
			continue
		}
		dst, isScript := "", false
		if rest, ok := strings.CutPrefix(name, dataDir); ok {
			key, sub, ok := strings.Cut(rest, "/")
			if !ok || sub == "" {
				return nil, fmt.Errorf("wheel %s: %s: not in a scheme directory of %s", f.File, name, dataDir)
			}
			var base string
			switch key {
			case "purelib":
				base = in.Scheme.Purelib
			case "platlib":
				base = in.Scheme.Platlib
			case "scripts":
				base, isScript = in.Scheme.Scripts, true
				if strings.Contains(sub, "/") {
					return nil, fmt.Errorf("wheel %s: %s: a script in a subdirectory", f.File, name)
				}
			case "data":
				base = in.Scheme.Data
			case "headers":
				base = filepath.Join(in.Scheme.Headers, out.Name)
			default:
				return nil, fmt.Errorf("wheel %s: %s: unknown scheme directory %q (want purelib, platlib, scripts, data or headers)", f.File, name, key)
			}
			dst = filepath.Join(base, filepath.FromSlash(sub))
		} else {
			dst = filepath.Join(root, filepath.FromSlash(name))
		}
		if in.startupHook(dst) {
			out.StartupHooks = append(out.StartupHooks, dst)
		}
		mode := fs.FileMode(0o644)
		if zf.Mode()&0o111 != 0 {
			mode = 0o755
		}
		var shebang []byte
		if isScript {
			// The mode stays the archive's, as pip leaves it; a
			// "#!python" line names the environment's interpreter.
			shebang = []byte("#!" + in.Scheme.Python)
		}
		sum, n, err := in.extract(zf, entries[name], dst, mode, shebang)
		if err != nil {
			return nil, fmt.Errorf("wheel %s: %s: %w", f.File, name, err)
		}
		if err := addRow(dst, sum, n); err != nil {
			return nil, err
		}
	}
	if ep, err := readEntry(files, distInfo+"/entry_points.txt"); err == nil {
		scripts, err := parseScripts(ep)
		if err != nil {
			return nil, fmt.Errorf("wheel %s: %s/entry_points.txt: %w", f.File, distInfo, err)
		}
		for _, s := range scripts {
			b := []byte(fmt.Sprintf("#!%s\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom %s import %s\nif __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(%s())\n",
				in.Scheme.Python, s.module, strings.Split(s.attr, ".")[0], s.attr))
			dst := filepath.Join(in.Scheme.Scripts, s.name)
			if err := in.write(dst, b, 0o755); err != nil {
				return nil, fmt.Errorf("wheel %s: entry point %s: %w", f.File, s.name, err)
			}
			if err := addFile(dst, b); err != nil {
				return nil, err
			}
		}
	}
	inst := filepath.Join(out.DistInfo, "INSTALLER")
	if err := in.write(inst, []byte("gpupass\n"), 0o644); err != nil {
		return nil, fmt.Errorf("wheel %s: %w", f.File, err)
	}
	if err := addFile(inst, []byte("gpupass\n")); err != nil {
		return nil, err
	}
	rec := filepath.Join(out.DistInfo, "RECORD")
	recRel, _ := filepath.Rel(root, rec)
	rows = append(rows, row{filepath.ToSlash(recRel), "", ""})
	sort.Slice(rows, func(i, j int) bool { return rows[i].rel < rows[j].rel })
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	for _, r := range rows {
		_ = w.Write([]string{r.rel, r.hash, r.size})
	}
	w.Flush()
	if err := in.write(rec, buf.Bytes(), 0o644); err != nil {
		return nil, fmt.Errorf("wheel %s: %w", f.File, err)
	}
	out.Files = append(out.Files, rec)
	return out, nil
}

// startupHook says whether Python runs dst when an interpreter of the
// environment starts: a .pth file at the top of site-packages (site runs
// its "import" lines) or the sitecustomize/usercustomize module (a file
// or a package).
func (in *Installer) startupHook(dst string) bool {
	for _, lib := range []string{in.Scheme.Purelib, in.Scheme.Platlib} {
		rel, err := filepath.Rel(lib, dst)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		switch r := filepath.ToSlash(rel); {
		case !strings.Contains(r, "/") && strings.HasSuffix(r, ".pth"):
			return true
		case r == "sitecustomize.py" || r == "usercustomize.py" || r == "sitecustomize/__init__.py" || r == "usercustomize/__init__.py":
			return true
		}
	}
	return false
}

// create opens dst for writing, refusing to follow a link or to replace
// a file this Installer did not write.
func (in *Installer) create(dst string, mode fs.FileMode) (*os.File, error) {
	if in.written == nil {
		in.written = map[string]bool{}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, err
	}
	if in.written[dst] {
		if err := os.Remove(dst); err != nil {
			return nil, err
		}
	}
	fh, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode)
	if errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%s is already in the environment and not from this bundle: not overwritten", dst)
	}
	if err != nil {
		return nil, err
	}
	in.written[dst] = true
	// The umask must not widen or narrow what the job may do.
	if err := fh.Chmod(mode); err != nil {
		fh.Close()
		return nil, err
	}
	return fh, nil
}

// write creates dst holding b.
func (in *Installer) write(dst string, b []byte, mode fs.FileMode) error {
	fh, err := in.create(dst, mode)
	if err != nil {
		return err
	}
	_, err = fh.Write(b)
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}

// extract streams zf into dst (never whole in memory: CUDA libraries in
// wheels are hundreds of MiB), checks it against its RECORD entry e and
// returns the sha256 (urlsafe base64) and size of what it wrote. With
// shebang set, a first line "#!python" is replaced by it.
func (in *Installer) extract(zf *zip.File, e recordEntry, dst string, mode fs.FileMode, shebang []byte) (string, int64, error) {
	rh, err := recordHash(e.algo)
	if err != nil {
		return "", 0, err
	}
	rc, err := zf.Open()
	if err != nil {
		return "", 0, err
	}
	defer rc.Close()
	fh, err := in.create(dst, mode)
	if err != nil {
		return "", 0, err
	}
	defer fh.Close()
	out := sha256.New()
	var written int64
	w := io.MultiWriter(fh, out)
	src := bufio.NewReaderSize(io.TeeReader(rc, rh), 64<<10)
	if shebang != nil {
		if head, _ := src.Peek(len("#!python")); string(head) == "#!python" {
			if _, err := src.ReadSlice('\n'); err != nil && err != io.EOF && err != bufio.ErrBufferFull {
				return "", 0, err
			}
			line := append(append([]byte(nil), shebang...), '\n')
			if _, err := w.Write(line); err != nil {
				return "", 0, err
			}
			written += int64(len(line))
		}
	}
	// zip's reader checks the CRC at EOF, so a corrupt archive fails here.
	n, err := io.Copy(w, src)
	if err != nil {
		return "", 0, err
	}
	written += n
	if err := fh.Close(); err != nil {
		return "", 0, err
	}
	if got := base64.RawURLEncoding.EncodeToString(rh.Sum(nil)); got != trimPad(e.digest) {
		return "", 0, fmt.Errorf("RECORD says %s=%s but the file hashes to %s=%s", e.algo, e.digest, e.algo, got)
	}
	if e.hasSize && uint64(e.size) != zf.UncompressedSize64 {
		return "", 0, fmt.Errorf("RECORD says %d bytes but the file has %d", e.size, zf.UncompressedSize64)
	}
	return base64.RawURLEncoding.EncodeToString(out.Sum(nil)), written, nil
}

func recordHash(algo string) (hash.Hash, error) {
	switch algo {
	case "sha256":
		return sha256.New(), nil
	case "sha384":
		return sha512.New384(), nil
	case "sha512":
		return sha512.New(), nil
	}
	// PEP 427 forbids md5 and sha1; anything unknown cannot be checked.
	return nil, fmt.Errorf("RECORD hash algorithm %q is not accepted (want sha256, sha384 or sha512)", algo)
}

func readFile(zf *zip.File) ([]byte, error) {
	rc, err := zf.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func readEntry(files map[string]*zip.File, name string) ([]byte, error) {
	zf, ok := files[name]
	if !ok {
		return nil, fmt.Errorf("no %s", name)
	}
	if zf.UncompressedSize64 > 16<<20 {
		return nil, fmt.Errorf("%s larger than 16 MiB", name)
	}
	return readFile(zf)
}

type entryScript struct{ name, module, attr string }

// parseScripts reads the console_scripts and gui_scripts of an
// entry_points.txt. Names and references are checked against what
// Python accepts, so that neither can put a path or code into the
// wrapper written for them.
func parseScripts(b []byte) ([]entryScript, error) {
	var out []entryScript
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
			continue
		case line[0] == '[':
			section = strings.TrimSpace(strings.Trim(line, "[]"))
			continue
		}
		if section != "console_scripts" && section != "gui_scripts" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want name = module:attr", line)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		m := entryRefRe.FindStringSubmatch(v)
		if !entryNameRe.MatchString(k) || path.Base(k) != k || m == nil || m[2] == "" {
			return nil, fmt.Errorf("entry point %q = %q: want a plain script name and module:attr", k, v)
		}
		out = append(out, entryScript{name: k, module: m[1], attr: m[2]})
	}
	return out, sc.Err()
}
