package ociimage_test

import (
	"archive/tar"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupass/gpupass/internal/ociimage"
)

// files lists the regular files of an image's flattened filesystem.
func files(t *testing.T, img v1.Image) map[string]string {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			out[h.Name] = string(b)
		}
	}
}

// TestBuild checks the image config and filesystem Build makes, for the
// empty base (with CA certificates) and for a base that has its own env,
// labels and files, which must survive.
func TestBuild(t *testing.T) {
	t.Parallel()
	amd64 := v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 := v1.Platform{OS: "linux", Architecture: "arm64"}
	withEnv := func(t *testing.T) v1.Image {
		base, err := ociimage.Empty(arm64)
		if err != nil {
			t.Fatal(err)
		}
		base, err = ociimage.Build(base, ociimage.Spec{Name: "sh", Binary: []byte("shell"), Platform: arm64})
		if err != nil {
			t.Fatal(err)
		}
		cf, _ := base.ConfigFile()
		cf = cf.DeepCopy()
		cf.Config.Env = []string{"PATH=/bin", "LANG=C.UTF-8"}
		cf.Config.Labels = map[string]string{"base": "kept", ociimage.LabelVersion: "base-version"}
		cf.Config.User = "0"
		base, err = mutate.ConfigFile(base, cf)
		if err != nil {
			t.Fatal(err)
		}
		return base
	}
	tests := []struct {
		name      string
		base      func(*testing.T) v1.Image
		spec      ociimage.Spec
		wantEnv   []string
		wantLabel map[string]string
		wantFiles []string
	}{
		{name: "empty base with CA certificates",
			base: func(t *testing.T) v1.Image { b, _ := ociimage.Empty(amd64); return b },
			spec: ociimage.Spec{Name: "gpupass", Binary: []byte("ELF"), Platform: amd64, CACerts: []byte("PEM"),
				Source: "https://github.com/gpupass/gpupass", Version: "v1.2.3", Revision: "abc123"},
			wantEnv: []string{"PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
			wantLabel: map[string]string{ociimage.LabelSource: "https://github.com/gpupass/gpupass",
				ociimage.LabelVersion: "v1.2.3", ociimage.LabelRevision: "abc123"},
			wantFiles: []string{"etc/ssl/certs/ca-certificates.crt", "usr/local/bin/gpupass"},
		},
		{name: "base env, labels and files are kept",
			base:      withEnv,
			spec:      ociimage.Spec{Name: "gpupass-agent", Binary: []byte("ELF"), Platform: arm64, Version: "v1.2.3"},
			wantEnv:   []string{"LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			wantLabel: map[string]string{"base": "kept", ociimage.LabelVersion: "v1.2.3"},
			wantFiles: []string{"usr/local/bin/gpupass-agent", "usr/local/bin/sh"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			img, err := ociimage.Build(tt.base(t), tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cf.Config
			if diff := cmp.Diff([]string{"/usr/local/bin/" + tt.spec.Name}, c.Entrypoint); diff != "" {
				t.Errorf("entrypoint (-want +got):\n%s", diff)
			}
			if c.User != "65532:65532" || len(c.Cmd) != 0 {
				t.Errorf("user %q cmd %q, want 65532:65532 and no cmd", c.User, c.Cmd)
			}
			if diff := cmp.Diff(tt.wantEnv, c.Env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantLabel, c.Labels); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
			if cf.OS != tt.spec.Platform.OS || cf.Architecture != tt.spec.Platform.Architecture {
				t.Errorf("platform %s/%s, want %s", cf.OS, cf.Architecture, tt.spec.Platform)
			}
			fs := files(t, img)
			var got []string
			for f := range fs {
				got = append(got, f)
			}
			slices.Sort(got)
			if diff := cmp.Diff(tt.wantFiles, got); diff != "" {
				t.Errorf("files (-want +got):\n%s", diff)
			}
			if fs["usr/local/bin/"+tt.spec.Name] != "ELF" {
				t.Errorf("the binary's content changed")
			}
			// Rebuilding gives the same digest: nothing depends on the clock.
			again, err := ociimage.Build(tt.base(t), tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			d1, _ := img.Digest()
			d2, _ := again.Digest()
			if d1 != d2 {
				t.Errorf("two builds of the same inputs: %s and %s", d1, d2)
			}
		})
	}
}

// TestBuildRefuses names the field a release would get wrong.
func TestBuildRefuses(t *testing.T) {
	t.Parallel()
	base, _ := ociimage.Empty(v1.Platform{OS: "linux", Architecture: "amd64"})
	for _, tt := range []struct {
		spec ociimage.Spec
		want string
	}{
		{ociimage.Spec{Name: "bin/gpupass", Binary: []byte("x"), Platform: v1.Platform{OS: "linux", Architecture: "amd64"}}, "want a file name"},
		{ociimage.Spec{Name: "gpupass", Platform: v1.Platform{OS: "linux", Architecture: "amd64"}}, "binary is empty"},
		{ociimage.Spec{Name: "gpupass", Binary: []byte("x")}, "want os/arch"},
	} {
		if _, err := ociimage.Build(base, tt.spec); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Build(%+v) = %v, want an error with %q", tt.spec, err, tt.want)
		}
	}
}

// TestPushIndex pushes a two-platform index by digest to an in-process
// registry: the returned reference resolves, each entry carries its
// platform, the tag points at the same digest, and plain HTTP is refused
// for a registry that is not on loopback.
func TestPushIndex(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	var imgs []v1.Image
	for _, arch := range []string{"amd64", "arm64"} {
		p := v1.Platform{OS: "linux", Architecture: arch}
		base, _ := ociimage.Empty(p)
		img, err := ociimage.Build(base, ociimage.Spec{Name: "gpupass", Binary: []byte("ELF " + arch), Platform: p})
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	idx, err := ociimage.Index(imgs...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ref, err := ociimage.Push(ctx, ociimage.PushOptions{Repository: host + "/gpupass/gpupass", Tags: []string{"1.2.3"}, PlainHTTP: true}, idx)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := idx.Digest()
	if ref != host+"/gpupass/gpupass@"+want.String() {
		t.Errorf("pushed %s, want the repository at digest %s", ref, want)
	}
	for _, r := range []string{ref, host + "/gpupass/gpupass:1.2.3"} {
		pr, _ := name.ParseReference(r, name.Insecure)
		got, err := remote.Index(pr)
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		m, _ := got.IndexManifest()
		var plats []string
		for _, d := range m.Manifests {
			plats = append(plats, d.Platform.String())
		}
		if diff := cmp.Diff([]string{"linux/amd64", "linux/arm64"}, plats); diff != "" {
			t.Errorf("%s platforms (-want +got):\n%s", r, diff)
		}
	}
	if _, err := ociimage.Push(ctx, ociimage.PushOptions{Repository: "registry.example.com/gpupass", PlainHTTP: true}, idx); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("plain HTTP to a remote registry: %v, want a refusal", err)
	}
}
