package testutil

import (
	"archive/zip"
	"bytes"
	"io"
	"testing"
)

// RewriteZip returns the zip at path with one entry's content changed.
func RewriteZip(t testing.TB, path, name string, change func([]byte) []byte) []byte {
	t.Helper()
	zr, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	changed := false
	for _, f := range zr.File {
		b := readZipFile(t, f)
		if f.Name == name {
			nb := change(b)
			changed = !bytes.Equal(nb, b)
			b = nb
		}
		w, err := zw.Create(f.Name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if !changed {
		t.Fatalf("RewriteZip: %s unchanged", name)
	}
	return buf.Bytes()
}

// ZipFiles is every entry of the zip at path, content by name.
func ZipFiles(t testing.TB, path string) map[string][]byte {
	t.Helper()
	zr, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	out := map[string][]byte{}
	for _, f := range zr.File {
		out[f.Name] = readZipFile(t, f)
	}
	return out
}

func readZipFile(t testing.TB, f *zip.File) []byte {
	t.Helper()
	rc, err := f.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
