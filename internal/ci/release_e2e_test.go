//go:build e2e

package ci_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"debug/macho"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestReleaseBuild runs scripts/release/build.sh as the release workflow
// does, for its three targets, and scripts/release/checksums.sh over the
// result: the CLI cross-compiles for linux/arm64 and darwin/arm64, the
// broker and the agent (cgo, NVML, Linux only) are built for the host only, every archive holds a
// binary for its platform, and checksums.txt is what sha256sum -c and the
// action's install script accept.
func TestReleaseBuild(t *testing.T) {
	bash := testutil.Tool(t, "bash")
	testutil.Tool(t, "sha256sum")
	root := testutil.RepoRoot(t)
	dist := t.TempDir()
	const version = "v0.0.0-e2e"
	host := runtime.GOOS + "/" + runtime.GOARCH
	build := func(target string, extra ...string) ([]byte, error) {
		goos, goarch, _ := strings.Cut(target, "/")
		cmd := exec.Command(bash, "scripts/release/build.sh")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "VERSION="+version, "DIST="+dist,
			"CGO_CFLAGS=-Wno-deprecated-declarations")
		cmd.Env = append(cmd.Env, extra...)
		return cmd.CombinedOutput()
	}
	targets := []string{"linux/amd64", "linux/arm64", "darwin/arm64"}
	if !slices.Contains(targets, host) {
		targets = append(targets, host)
	}
	for _, target := range targets {
		if b, err := build(target); err != nil {
			t.Fatalf("build.sh %s: %v\n%s", target, err, b)
		}
	}
	// The release workflow insists on native builds; a cross build cannot
	// make the broker and agent archive.
	cross := "linux/arm64"
	if host == cross {
		cross = "linux/amd64"
	}
	if b, err := build(cross, "REQUIRE_NATIVE=1"); err == nil || !strings.Contains(string(b), "native") {
		t.Errorf("REQUIRE_NATIVE=1 on a cross build: %v\n%s", err, b)
	}

	cmd := exec.Command(bash, filepath.Join(root, "scripts", "release", "checksums.sh"), dist)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("checksums.sh: %v\n%s", err, b)
	}
	var want []string
	for _, target := range targets {
		want = append(want, "gpupass_"+strings.ReplaceAll(target, "/", "_")+".tar.gz")
	}
	want = append(want, "gpupass-all_"+strings.ReplaceAll(host, "/", "_")+".tar.gz")
	slices.Sort(want)
	sums, err := os.ReadFile(filepath.Join(dist, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, l := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 || len(f[0]) != 64 {
			t.Errorf("checksums.txt line %q", l)
			continue
		}
		listed = append(listed, f[1])
	}
	if diff := cmp.Diff(want, listed); diff != "" {
		t.Errorf("checksums.txt lists (-want +got):\n%s", diff)
	}
	check := exec.Command("sha256sum", "-c", "checksums.txt")
	check.Dir = dist
	if b, err := check.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c: %v\n%s", err, b)
	}

	for _, target := range targets {
		goos, goarch, _ := strings.Cut(target, "/")
		files := untar(t, filepath.Join(dist, "gpupass_"+goos+"_"+goarch+".tar.gz"))
		if diff := cmp.Diff([]string{"gpupass"}, keys(files)); diff != "" {
			t.Errorf("%s CLI archive holds (-want +got):\n%s", target, diff)
			continue
		}
		if got := binaryPlatform(t, files["gpupass"]); got != target {
			t.Errorf("gpupass in the %s archive is a %s binary", target, got)
		}
	}
	all := untar(t, filepath.Join(dist, "gpupass-all_"+strings.ReplaceAll(host, "/", "_")+".tar.gz"))
	wantAll := []string{"gpupass", "gpupass-broker"}
	if runtime.GOOS == "linux" {
		// gpupass-agent for a GPU node (-tags nokube), and the one with
		// the Kubernetes executor that the agent image holds.
		wantAll = []string{"gpupass", "gpupass-agent", "gpupass-agent-kubernetes", "gpupass-broker"}
	}
	if diff := cmp.Diff(wantAll, keys(all)); diff != "" {
		t.Errorf("the -all archive holds (-want +got):\n%s", diff)
	}
	for _, agent := range []string{"gpupass-agent", "gpupass-agent-kubernetes"} {
		if runtime.GOOS != "linux" {
			break
		}
		f, err := elf.NewFile(bytes.NewReader(all[agent]))
		if err != nil {
			t.Fatal(err)
		}
		if libs, _ := f.ImportedLibraries(); len(libs) == 0 {
			t.Errorf("%s is statically linked: it must be built with cgo for NVML", agent)
		}
	}
	// The GPU node's agent links no client-go (cmd/gpupass-agent's
	// TestNodeAgentSize holds the build to 15 MiB).
	if n := len(all["gpupass-agent"]); runtime.GOOS == "linux" && n > 15<<20 {
		t.Errorf("the release's gpupass-agent is %.2f MiB, over 15 MiB: built without -tags nokube?", float64(n)/(1<<20))
	}
	// The host CLI runs and carries the release version.
	bin := filepath.Join(t.TempDir(), "gpupass")
	if err := os.WriteFile(bin, all["gpupass"], 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(bin, "version").CombinedOutput(); err != nil || strings.TrimSpace(string(b)) != "gpupass "+version {
		t.Errorf("gpupass version = %q (%v), want gpupass %s", b, err, version)
	}
}

func untar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// binaryPlatform names the GOOS/GOARCH of an ELF or Mach-O executable.
func binaryPlatform(t *testing.T, b []byte) string {
	t.Helper()
	if f, err := elf.NewFile(bytes.NewReader(b)); err == nil {
		switch f.Machine {
		case elf.EM_X86_64:
			return "linux/amd64"
		case elf.EM_AARCH64:
			return "linux/arm64"
		}
		return "linux/" + f.Machine.String()
	}
	if f, err := macho.NewFile(bytes.NewReader(b)); err == nil {
		switch f.Cpu {
		case macho.CpuArm64:
			return "darwin/arm64"
		case macho.CpuAmd64:
			return "darwin/amd64"
		}
		return "darwin/" + f.Cpu.String()
	}
	return "unknown"
}
