// Package debimage builds a container image from what is installed on
// this Debian machine: the files of named packages and their installed
// dependency closure (as dpkg records them), plus loose files and
// symlinks, written as an OCI image layout tarball that
// `ctr images import` reads. It is how the local Kubernetes test cluster
// gets its images (the sandbox "pause" image, busybox, the run image with
// python3 and torch) with no Docker, no PyPI and no registry on the
// internet.
//
// The layer is written uncompressed, with media type
// application/vnd.oci.image.layer.v1.tar: the run image is about 1 GB,
// and gzip on two shared cores would cost minutes per build, while an
// OCI layout (unlike a docker-save tarball, whose layers containerd
// re-compresses on import) is imported as it is. Output is reproducible:
// entries are sorted, times zeroed, owners root, so the same inputs give
// the same digest, and Build caches by a content key.
package debimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// Spec says what goes into an image. The result has one layer.
type Spec struct {
	// Name is the image's name, with a tag (gpupass.local/run:1); ctr
	// import names the image after it.
	Name string
	// Packages are installed Debian packages; each one's files and those
	// of its installed Depends/Pre-Depends closure go in, less
	// documentation (ExcludePrefixes).
	Packages []string
	// Files are copied from the machine: key = path in the image,
	// value = path here.
	Files map[string]string
	// Symlinks: key = path in the image, value = link target.
	Symlinks map[string]string
	// TmpDirs are created empty with mode 01777 (/tmp).
	TmpDirs []string
	// Entrypoint, Cmd, Env, WorkingDir go into the image config.
	Entrypoint, Cmd, Env []string
	WorkingDir           string
}

// ExcludePrefixes are package paths left out: documentation nobody in a
// container reads, a fifth of the run image otherwise.
var ExcludePrefixes = []string{"/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/", "/usr/share/lintian/", "/usr/share/bug/", "/usr/include/"}

// builderVersion changes the content key when the image layout changes.
const builderVersion = "debimage-2"

// Result is a built image.
type Result struct {
	// Path is the OCI layout tarball.
	Path string
	// Digest is the manifest digest (sha256:...): the image pinned.
	Digest string
	// Key is the content key the tarball is cached under.
	Key string
}

// Build writes the image into cacheDir/<name>-<key>.tar unless it is
// there, and returns it. The key covers the spec, the versions of every
// package in the closure and the contents of Files, so an upgraded
// package or a rebuilt binary makes a new image. Older images of the same
// name are removed (each can be a GB).
func Build(cacheDir string, spec Spec) (Result, error) {
	if err := spec.Validate(); err != nil {
		return Result{}, err
	}
	pkgs, err := Closure(spec.Packages)
	if err != nil {
		return Result{}, err
	}
	key, err := contentKey(spec, pkgs)
	if err != nil {
		return Result{}, err
	}
	base := strings.NewReplacer("/", "_", ":", "_").Replace(spec.Name)
	out := filepath.Join(cacheDir, base+"-"+key[:16]+".tar")
	if dg, err := os.ReadFile(out + ".digest"); err == nil {
		if _, err := os.Stat(out); err == nil {
			return Result{Path: out, Digest: string(dg), Key: key}, nil
		}
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return Result{}, err
	}
	old, _ := filepath.Glob(filepath.Join(cacheDir, base+"-*.tar*"))
	tmp, err := os.CreateTemp(cacheDir, ".tmp-"+base+"-")
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(tmp.Name())
	dg, err := write(tmp, spec, pkgs)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Result{}, fmt.Errorf("writing image %s: %w", spec.Name, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return Result{}, err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return Result{}, err
	}
	if err := os.WriteFile(out+".digest", []byte(dg), 0o644); err != nil {
		return Result{}, err
	}
	for _, o := range old {
		if o != out && o != out+".digest" {
			_ = os.Remove(o)
		}
	}
	return Result{Path: out, Digest: dg, Key: key}, nil
}

// Package is one installed Debian package.
type Package struct{ Name, Version string }

// Closure returns the installed packages named and everything they
// depend on (Depends and Pre-Depends; of alternatives the first one
// installed, directly or through Provides), sorted by name. A named
// package that is not installed is an error naming the apt-get fix.
func Closure(names []string) ([]Package, error) {
	if len(names) == 0 {
		return nil, nil
	}
	out, err := exec.Command("dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${Package}\t${Version}\t${Provides}\t${Pre-Depends}, ${Depends}\n").Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-query: %w", err)
	}
	type info struct{ version, deps string }
	installed := map[string]info{}
	provides := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 || !strings.HasPrefix(f[0], "ii") {
			continue
		}
		installed[f[1]] = info{f[2], f[4]}
		for _, p := range strings.Split(f[3], ",") {
			if p = depName(p); p != "" {
				if _, ok := provides[p]; !ok {
					provides[p] = f[1]
				}
			}
		}
	}
	resolve := func(n string) (string, bool) {
		if _, ok := installed[n]; ok {
			return n, true
		}
		p, ok := provides[n]
		return p, ok
	}
	seen := map[string]bool{}
	queue := []string{}
	for _, n := range names {
		p, ok := resolve(n)
		if !ok {
			return nil, fmt.Errorf("debian package %s is not installed (apt-get install %s)", n, n)
		}
		queue = append(queue, p)
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		for _, dep := range strings.Split(installed[p].deps, ",") {
			for _, alt := range strings.Split(dep, "|") {
				if q, ok := resolve(depName(alt)); ok {
					queue = append(queue, q)
					break
				}
			}
		}
	}
	pkgs := make([]Package, 0, len(seen))
	for p := range seen {
		pkgs = append(pkgs, Package{p, installed[p].version})
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
	return pkgs, nil
}

// depName is the package name of one dependency: "libc6 (>= 2.34)",
// "python3:any" -> libc6, python3.
func depName(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, " (:"); i >= 0 {
		s = s[:i]
	}
	return s
}

func contentKey(spec Spec, pkgs []Package) (string, error) {
	h := sha256.New()
	b, _ := json.Marshal(spec)
	fmt.Fprintf(h, "%s\n%s\n", builderVersion, b)
	for _, p := range pkgs {
		fmt.Fprintf(h, "%s=%s\n", p.Name, p.Version)
	}
	for _, dst := range slices.Sorted(maps.Keys(spec.Files)) {
		f, err := os.Open(spec.Files[dst])
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// entry is one path in the layer: src is where its content or link
// target comes from on this machine ("" for a directory we make).
type entry struct {
	src, link string
	dir       bool
	mode      int64
}

// packageFiles lists the closure's files, each under its canonical path:
// with /usr merged, dpkg may record /lib/x/libc.so.6, which here is
// /usr/lib/x/libc.so.6 through the /lib symlink; in a layer a directory
// /lib would clash with the /lib -> usr/lib symlink, so parent
// directories are resolved and the top-level symlinks copied as links.
func packageFiles(pkgs []Package, ents map[string]*entry) error {
	if len(pkgs) == 0 {
		return nil
	}
	args := []string{"-L"}
	for _, p := range pkgs {
		args = append(args, p.Name)
	}
	out, err := exec.Command("dpkg-query", args...).Output()
	if err != nil {
		return fmt.Errorf("dpkg-query -L: %w", err)
	}
	canon := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "/") || line == "/." {
			continue
		}
		if slices.ContainsFunc(ExcludePrefixes, func(p string) bool { return strings.HasPrefix(line+"/", p) }) {
			continue
		}
		dir, base := path.Split(line)
		cd, ok := canon[dir]
		if !ok {
			r, err := filepath.EvalSymlinks(dir)
			if err != nil {
				continue // a directory dpkg lists but the admin removed
			}
			cd = r
			canon[dir] = r
		}
		p := path.Join(cd, base)
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if err := addPath(ents, p, p, fi); err != nil {
			return err
		}
	}
	if err := alternatives(ents); err != nil {
		return err
	}
	for _, top := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		if fi, err := os.Lstat(top); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			if err := addPath(ents, top, top, fi); err != nil {
				return err
			}
		}
	}
	return nil
}

// alternatives adds the links update-alternatives made for the closure
// (libblas.so.3 -> /etc/alternatives/libblas.so.3-x86_64-linux-gnu ->
// .../blas/libblas.so.3): no package lists them, and without them torch
// cannot load its BLAS. A link counts when it sits in one of the
// closure's directories and ends at one of the closure's files.
func alternatives(ents map[string]*entry) error {
	var dirs []string
	for p, e := range ents {
		if e.dir {
			dirs = append(dirs, p)
		}
	}
	for _, d := range dirs {
		des, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, de := range des {
			p := path.Join(d, de.Name())
			if _, ok := ents[p]; ok || de.Type()&os.ModeSymlink == 0 {
				continue
			}
			l, err := os.Readlink(p)
			if err != nil || !strings.HasPrefix(l, "/etc/alternatives/") {
				continue
			}
			final, err := filepath.EvalSymlinks(p)
			if err != nil {
				continue
			}
			if _, ok := ents[final]; !ok {
				continue
			}
			alt, err := os.Readlink(l)
			if err != nil {
				continue
			}
			ents[p] = &entry{link: l, mode: 0o777}
			ents[l] = &entry{link: alt, mode: 0o777}
		}
	}
	return nil
}

func addPath(ents map[string]*entry, dst, src string, fi os.FileInfo) error {
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		l, err := os.Readlink(src)
		if err != nil {
			return err
		}
		ents[dst] = &entry{link: l, mode: 0o777}
	case fi.IsDir():
		ents[dst] = &entry{dir: true, mode: tarMode(fi.Mode())}
	case fi.Mode().IsRegular():
		ents[dst] = &entry{src: src, mode: tarMode(fi.Mode())}
	}
	return nil
}

// tarMode is the tar header mode of a Go file mode: Go keeps the setuid,
// setgid and sticky bits outside the permission bits.
func tarMode(m os.FileMode) int64 {
	t := int64(m.Perm())
	if m&os.ModeSetuid != 0 {
		t |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		t |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		t |= 0o1000
	}
	return t
}

func write(w io.Writer, spec Spec, pkgs []Package) (string, error) {
	ents := map[string]*entry{}
	if err := packageFiles(pkgs, ents); err != nil {
		return "", err
	}
	for _, dst := range slices.Sorted(maps.Keys(spec.Files)) {
		fi, err := os.Stat(spec.Files[dst])
		if err != nil {
			return "", err
		}
		ents[dst] = &entry{src: spec.Files[dst], mode: int64(fi.Mode().Perm())}
	}
	for dst, l := range spec.Symlinks {
		ents[dst] = &entry{link: l, mode: 0o777}
	}
	for _, d := range spec.TmpDirs {
		ents[d] = &entry{dir: true, mode: 0o1777}
	}
	// Every parent directory, so that the layer stands alone.
	for p := range ents {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := ents[d]; !ok {
				ents[d] = &entry{dir: true, mode: 0o755}
			}
		}
	}

	// The layer goes to a temporary file first: its digest is needed
	// before the layout's tar header can name it.
	lf, err := os.CreateTemp("", "debimage-layer-")
	if err != nil {
		return "", err
	}
	defer os.Remove(lf.Name())
	defer lf.Close()
	lh := sha256.New()
	if err := writeLayer(io.MultiWriter(lf, lh), ents); err != nil {
		return "", err
	}
	lsize, err := lf.Seek(0, io.SeekCurrent)
	if err != nil {
		return "", err
	}
	layerDigest := "sha256:" + hex.EncodeToString(lh.Sum(nil))

	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": spec.Entrypoint,
			"Cmd":        spec.Cmd,
			"Env":        spec.Env,
			"WorkingDir": spec.WorkingDir,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	cfgDigest := digest(cfg)
	man, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfgDigest, "size": len(cfg)},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": lsize}},
	})
	manDigest := digest(man)
	_, tag, _ := strings.Cut(spec.Name[strings.LastIndex(spec.Name, "/")+1:], ":")
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json",
			"digest":    manDigest,
			"size":      len(man),
			"annotations": map[string]string{
				"io.containerd.image.name":          spec.Name,
				"org.opencontainers.image.ref.name": tag,
			},
		}},
	})

	tw := tar.NewWriter(w)
	file := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	blob := func(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return "", err
	}
	if err := file("index.json", index); err != nil {
		return "", err
	}
	if err := file(blob(cfgDigest), cfg); err != nil {
		return "", err
	}
	if err := file(blob(manDigest), man); err != nil {
		return "", err
	}
	if err := tw.WriteHeader(&tar.Header{Name: blob(layerDigest), Mode: 0o644, Size: lsize, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
		return "", err
	}
	if _, err := lf.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	if _, err := io.Copy(tw, lf); err != nil {
		return "", err
	}
	return manDigest, tw.Close()
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func writeLayer(w io.Writer, ents map[string]*entry) error {
	tw := tar.NewWriter(w)
	for _, p := range slices.Sorted(maps.Keys(ents)) {
		e := ents[p]
		h := &tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: e.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case e.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		default:
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		f, err := os.Open(e.src)
		if err != nil {
			return err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return err
		}
		h.Size = fi.Size()
		if err := tw.WriteHeader(h); err != nil {
			f.Close()
			return err
		}
		_, err = io.CopyN(tw, f, h.Size)
		f.Close()
		if err != nil {
			return fmt.Errorf("copying %s: %w", e.src, err)
		}
	}
	return tw.Close()
}

var errNoName = errors.New("image spec has no name")

// Validate checks a spec before the work: a name with a tag.
func (s Spec) Validate() error {
	if s.Name == "" {
		return errNoName
	}
	if !strings.Contains(s.Name[strings.LastIndex(s.Name, "/")+1:], ":") {
		return fmt.Errorf("image name %q has no tag", s.Name)
	}
	return nil
}
