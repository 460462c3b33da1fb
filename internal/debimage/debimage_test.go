package debimage

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// layout reads an OCI layout tarball: its files by name.
func layout(t *testing.T, p string) map[string][]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func TestBuildPackageClosureLayout(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		testutil.Missing(t, "dpkg-query (a Debian machine)")
	}
	// base-files and libc6 are on every Debian machine; busybox-static
	// is what the cluster's images need anyway.
	if _, err := Closure([]string{"libc6"}); err != nil {
		testutil.Missing(t, "%v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "hello")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := Spec{
		Name: "gpupass.local/test:1", Packages: []string{"libc6"},
		Files: map[string]string{"/usr/local/bin/hello": bin}, Symlinks: map[string]string{"/usr/local/bin/hi": "hello"},
		TmpDirs: []string{"/tmp"}, Entrypoint: []string{"/usr/local/bin/hello"},
	}
	r, err := Build(filepath.Join(dir, "cache"), spec)
	if err != nil {
		t.Fatal(err)
	}
	files := layout(t, r.Path)
	var idx struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 || idx.Manifests[0].Digest != r.Digest || idx.Manifests[0].Annotations["io.containerd.image.name"] != spec.Name {
		t.Fatalf("index.json = %s, want one manifest %s named %s", files["index.json"], r.Digest, spec.Name)
	}
	var man struct {
		Layers []struct{ Digest, MediaType string }
	}
	if err := json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(r.Digest, "sha256:")], &man); err != nil {
		t.Fatal(err)
	}
	if len(man.Layers) != 1 || man.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar" {
		t.Fatalf("manifest layers = %+v, want one uncompressed OCI layer", man.Layers)
	}
	layer := files["blobs/sha256/"+strings.TrimPrefix(man.Layers[0].Digest, "sha256:")]
	got := map[string]*tar.Header{}
	tr := tar.NewReader(strings.NewReader(string(layer)))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	// The dynamic loader under its canonical (merged-/usr) path, the
	// top-level link to it, the loose file, link and sticky /tmp; no docs.
	for name, typ := range map[string]byte{
		"usr/local/bin/hello": tar.TypeReg,
		"usr/local/bin/hi":    tar.TypeSymlink,
		"tmp/":                tar.TypeDir,
	} {
		h, ok := got[name]
		if !ok || h.Typeflag != typ {
			t.Errorf("layer entry %s: %+v, want type %c", name, h, typ)
		}
	}
	if h := got["tmp/"]; h != nil && h.Mode != 0o1777 {
		t.Errorf("tmp/ mode %o, want 1777", h.Mode)
	}
	loader := false
	for name, h := range got {
		if strings.HasPrefix(name, "usr/share/doc/") {
			t.Errorf("layer has documentation %s", name)
		}
		if strings.HasSuffix(name, "ld-linux-x86-64.so.2") && h.Typeflag != tar.TypeDir {
			loader = true
		}
		if h.ModTime.Unix() != 0 || h.Uid != 0 {
			t.Errorf("%s: mtime %v uid %d, want 0 and 0 (reproducible)", name, h.ModTime, h.Uid)
		}
	}
	if !loader {
		t.Error("layer lacks the dynamic loader ld-linux-x86-64.so.2 (libc6)")
	}

	// The same inputs give the same image, from the cache; a changed file
	// gives a new one and removes the old.
	again, err := Build(filepath.Join(dir, "cache"), spec)
	if err != nil || again != r {
		t.Fatalf("second build = %+v, %v; want the cached %+v", again, err, r)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho changed\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	changed, err := Build(filepath.Join(dir, "cache"), spec)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Digest == r.Digest || changed.Path == r.Path {
		t.Fatalf("a changed file kept the image %s", r.Digest)
	}
	if _, err := os.Stat(r.Path); !os.IsNotExist(err) {
		t.Errorf("old image %s not removed: %v", r.Path, err)
	}
}

func TestClosureNotInstalled(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		testutil.Missing(t, "dpkg-query (a Debian machine)")
	}
	_, err := Closure([]string{"gpupass-no-such-package"})
	if err == nil || !strings.Contains(err.Error(), "apt-get install gpupass-no-such-package") {
		t.Fatalf("Closure(missing) = %v, want an error naming the apt-get fix", err)
	}
}

func TestDepName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"libc6 (>= 2.34)":      "libc6",
		" python3:any":         "python3",
		"python3-numpy-abi9":   "python3-numpy-abi9",
		" libgcc-s1 (>= 3.0) ": "libgcc-s1",
		"":                     "",
	} {
		if got := depName(in); got != want {
			t.Errorf("depName(%q) = %q, want %q", in, got, want)
		}
	}
}

// layerEntries reads the one layer of a built image.
func layerEntries(t *testing.T, r Result) map[string]*tar.Header {
	t.Helper()
	files := layout(t, r.Path)
	var man struct{ Layers []struct{ Digest string } }
	if err := json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(r.Digest, "sha256:")], &man); err != nil {
		t.Fatal(err)
	}
	got := map[string]*tar.Header{}
	tr := tar.NewReader(strings.NewReader(string(files["blobs/sha256/"+strings.TrimPrefix(man.Layers[0].Digest, "sha256:")])))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
}

// TestBuildKeepsAlternativesLinks: libblas.so.3, which torch loads, is a
// link update-alternatives made (libblas.so.3 -> /etc/alternatives/... ->
// blas/libblas.so.3) and no package lists; without it `import torch`
// fails in the image with "libblas.so.3: cannot open shared object file".
func TestBuildKeepsAlternativesLinks(t *testing.T) {
	link := "/usr/lib/x86_64-linux-gnu/libblas.so.3"
	target, err := os.Readlink(link)
	if err != nil || !strings.HasPrefix(target, "/etc/alternatives/") {
		testutil.Missing(t, "%s is not an alternatives link here (Debian package libblas3, a python3-torch dependency)", link)
	}
	r, err := Build(t.TempDir(), Spec{Name: "gpupass.local/blas:1", Packages: []string{"libblas3"}})
	if err != nil {
		t.Fatal(err)
	}
	got := layerEntries(t, r)
	h := got[strings.TrimPrefix(link, "/")]
	if h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != target {
		t.Fatalf("layer entry %s = %+v, want a link to %s", link, h, target)
	}
	if a := got[strings.TrimPrefix(target, "/")]; a == nil || a.Typeflag != tar.TypeSymlink {
		t.Fatalf("layer lacks the alternatives link %s: %+v", target, a)
	}
}
