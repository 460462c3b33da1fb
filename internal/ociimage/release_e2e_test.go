//go:build e2e

package ociimage_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/gpupass/gpupass/internal/ociimage"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
)

// goBuild builds a package of this module (or of its dependencies, as
// crane) with the environment given, into dir, and returns the binary.
func goBuild(t *testing.T, dir, pkg, out string, env ...string) string {
	t.Helper()
	p := filepath.Join(dir, out)
	args := []string{"build", "-trimpath", "-o", p}
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "LDFLAGS="); ok {
			args = append(args, "-ldflags", v)
		}
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = testutil.RepoRoot(t)
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return p
}

// TestReleaseImageToRegistry is the release's image step as the release
// runs it: the gpupass CLI built statically (CGO_ENABLED=0, the release's
// version flag) for linux/amd64 and linux/arm64, turned into an image
// index by scripts/release/image on a base generated here (a tarball with
// its own file, env and label: no network), pushed by digest to the real
// distribution registry on loopback. crane then reads what a runner
// would: the index's platforms, each config's entrypoint, user, labels
// and platform; and the host's binary, taken out of the pulled image's
// filesystem, runs and prints the release's version.
func TestReleaseImageToRegistry(t *testing.T) {
	addr := regtest.StartRegistry(t)
	dir := t.TempDir()
	const version = "v1.2.3-e2e"
	ld := "LDFLAGS=-s -w -X github.com/gpupass/gpupass/internal/buildinfo.Version=" + version
	bins := map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		bins[arch] = goBuild(t, dir, "./cmd/gpupass", "gpupass-"+arch, "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, ld)
	}
	tool := goBuild(t, dir, "./scripts/release/image", "image")
	crane := goBuild(t, dir, "github.com/google/go-containerregistry/cmd/crane", "crane")

	// The base: one file, an env var and a label the image must keep.
	baseImg, err := ociimage.Build(mutate.MediaType(empty.Image, "application/vnd.oci.image.manifest.v1+json"),
		ociimage.Spec{Name: "base-marker", Binary: []byte("from the base"), Platform: v1.Platform{OS: "linux", Architecture: "amd64"}})
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := baseImg.ConfigFile()
	cf = cf.DeepCopy()
	cf.Config.Env = append(cf.Config.Env, "BASE_ENV=kept")
	cf.Config.Labels = map[string]string{"org.example.base": "kept"}
	if baseImg, err = mutate.ConfigFile(baseImg, cf); err != nil {
		t.Fatal(err)
	}
	baseTar := filepath.Join(dir, "base.tar")
	if err := tarball.WriteToFile(baseTar, name.MustParseReference("base:test"), baseImg); err != nil {
		t.Fatal(err)
	}

	repo := addr + "/gpupass/gpupass"
	cmd := exec.Command(tool, "--repository", repo, "--tag", "1.2.3", "--name", "gpupass",
		"--binary", "linux/amd64="+bins["amd64"], "--binary", "linux/arm64="+bins["arm64"],
		"--base", baseTar, "--source", "https://github.com/gpupass/gpupass", "--version", version,
		"--revision", "0123456789abcdef0123456789abcdef01234567", "--plain-http")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("image: %v\n%s", err, out)
	}
	ref := strings.TrimSpace(string(out))
	if !strings.HasPrefix(ref, repo+"@sha256:") || len(ref) != len(repo)+len("@sha256:")+64 {
		t.Fatalf("image printed %q, want %s@sha256:<digest>", ref, repo)
	}

	craneOut := func(args ...string) []byte {
		t.Helper()
		b, err := exec.Command(crane, append(args, "--insecure")...).Output()
		if err != nil {
			t.Fatalf("crane %v: %v", args, err)
		}
		return b
	}
	// The tag names the same digest the tool printed.
	if d := strings.TrimSpace(string(craneOut("digest", repo+":1.2.3"))); !strings.HasSuffix(ref, "@"+d) {
		t.Errorf("tag 1.2.3 is %s, the pushed reference %s", d, ref)
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(craneOut("manifest", ref), &idx); err != nil {
		t.Fatal(err)
	}
	var plats []string
	for _, m := range idx.Manifests {
		plats = append(plats, m.Platform.String())
	}
	if diff := cmp.Diff([]string{"linux/amd64", "linux/arm64"}, plats); diff != "" {
		t.Errorf("index platforms (-want +got):\n%s", diff)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		var cfg v1.ConfigFile
		if err := json.Unmarshal(craneOut("config", "--platform", "linux/"+arch, ref), &cfg); err != nil {
			t.Fatal(err)
		}
		c := cfg.Config
		if cfg.OS != "linux" || cfg.Architecture != arch {
			t.Errorf("%s config platform %s/%s", arch, cfg.OS, cfg.Architecture)
		}
		if diff := cmp.Diff([]string{"/usr/local/bin/gpupass"}, c.Entrypoint); diff != "" {
			t.Errorf("%s entrypoint (-want +got):\n%s", arch, diff)
		}
		if c.User != "65532:65532" {
			t.Errorf("%s user %q, want 65532:65532 (nonroot)", arch, c.User)
		}
		want := map[string]string{"org.example.base": "kept", "org.opencontainers.image.source": "https://github.com/gpupass/gpupass",
			"org.opencontainers.image.version": version, "org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567"}
		if diff := cmp.Diff(want, c.Labels); diff != "" {
			t.Errorf("%s labels (-want +got):\n%s", arch, diff)
		}
		if !strings.Contains(strings.Join(c.Env, " "), "BASE_ENV=kept") {
			t.Errorf("%s env %q lost the base's BASE_ENV", arch, c.Env)
		}
	}

	// Pull the host's image and run its binary.
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		return
	}
	pr, _ := name.ParseReference(ref, name.Insecure)
	img, err := remote.Image(pr, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		t.Fatal(err)
	}
	fs := files(t, img)
	if fs["usr/local/bin/base-marker"] != "from the base" {
		t.Errorf("the base's file is missing from the image")
	}
	bin := filepath.Join(dir, "from-image")
	if err := os.WriteFile(bin, []byte(fs["usr/local/bin/gpupass"]), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(b), version) {
		t.Errorf("the image's gpupass --version: %v\n%s\nwant %s", err, b, version)
	}
}
