package k8stest

import (
	"archive/tar"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// LoadOCIImage imports an image built in the test (go-containerregistry,
// e.g. internal/ociimage's release image of a gpupass binary) into the
// cluster as name (REPO:TAG) and returns it pinned by digest
// (REPO@sha256:...), as LoadImage does for a tarball.
func (c *Cluster) LoadOCIImage(t testing.TB, img v1.Image, name string) string {
	t.Helper()
	return c.LoadImage(t, ociTar(t, img, name))
}

// ociTar writes img as an OCI layout tarball that containerd imports as
// name, and returns its path.
func ociTar(t testing.TB, img v1.Image, name string) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	// containerd names an imported image after this annotation.
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"io.containerd.image.name": name})); err != nil {
		t.Fatalf("writing image %s as an OCI layout: %v", name, err)
	}
	tarPath := filepath.Join(dir, "image.tar")
	if err := tarDir(filepath.Join(dir, "layout"), tarPath); err != nil {
		t.Fatalf("writing image %s as an OCI layout tarball: %v", name, err)
	}
	return tarPath
}

// tarDir writes the regular files and directories under dir into a tar
// file at out, with names relative to dir.
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
