package k8stest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestBuildScriptChecksVersionWithoutARace runs scripts/k8s-build.sh with
// a stub go command (no network, no compiler): go mod download hands it a
// go.mod with the staging replaces, go build writes stub binaries. The stub
// kubectl writes its version in two writes, as the real one does ("Client
// Version", then "Kustomize Version"). The script's check used to pipe it
// into grep -q under pipefail: grep left after the first line, kubectl died
// of SIGPIPE on the second, and a good build failed with "the version
// ldflags did not apply" (4 of 40 checks at a light load; a cold .ci/run
// lost a 60-minute build to it).
func TestBuildScriptChecksVersionWithoutARace(t *testing.T) {
	t.Parallel()
	bash := testutil.Tool(t, "bash")
	testutil.Tool(t, "flock")
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "k8s-build.sh")
	for _, tc := range []struct {
		name, version string
		wantOK        bool
		wantStderr    string
	}{
		{"kubectl reports the version", "v1.36.3", true, "k8s-build: built Kubernetes v1.36.3"},
		{"kubectl reports another version", "v0.0.0-master", false, `built kubectl reports "Client Version: v0.0.0-master", not v1.36.3`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			stubs := filepath.Join(dir, "stubs")
			if err := os.MkdirAll(stubs, 0o755); err != nil {
				t.Fatal(err)
			}
			var replaces strings.Builder
			for i := range 25 {
				fmt.Fprintf(&replaces, "\tk8s.io/staging%d => ./staging/src/k8s.io/staging%d\n", i, i)
			}
			upstream := filepath.Join(dir, "upstream.mod")
			writeFile(t, upstream, 0o644, "module k8s.io/kubernetes\n\ngo 1.25.0\n\nreplace (\n"+replaces.String()+")\n")
			kubectl := "#!/bin/sh\necho 'Client Version: " + tc.version + "'\nsleep 0.3\necho 'Kustomize Version: v5.8.1'\n"
			// The stub go: "mod download -json" names the upstream go.mod;
			// "build ... -o DIR/ ..." writes each binary; "env X" prints
			// nothing.
			goStub := `#!/bin/bash
case "$1 $2" in
"mod download") printf '{\n\t"GoMod": "%s",\n}\n' ` + shellQuote(upstream) + ` ;;
build*)
	out=""
	while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done
	for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do printf '#!/bin/sh\n' >"$out$b"; chmod +x "$out$b"; done
	cat >"${out}kubectl" <<'KUBECTL'
` + kubectl + `KUBECTL
	chmod +x "${out}kubectl" ;;
*) ;;
esac
`
			writeFile(t, filepath.Join(stubs, "go"), 0o755, goStub)
			cache := filepath.Join(dir, "cache")
			cmd := exec.Command(bash, script)
			cmd.Env = append(os.Environ(), "PATH="+stubs+":"+os.Getenv("PATH"), "GPUPASS_K8S_CACHE="+cache, "K8S_VERSION=v1.36.3")
			stdout, stderr, code := testutil.Run(t, cmd)
			if tc.wantOK != (code == 0) {
				t.Fatalf("k8s-build.sh exit %d, want success %v\nstdout: %s\nstderr: %s", code, tc.wantOK, stdout, stderr)
			}
			if !strings.Contains(stderr, tc.wantStderr) {
				t.Fatalf("stderr lacks %q:\n%s", tc.wantStderr, stderr)
			}
			bin := filepath.Join(cache, "v1.36.3", "bin")
			if _, err := os.Stat(filepath.Join(bin, "kubectl")); tc.wantOK != (err == nil) {
				t.Fatalf("cache bin/kubectl: %v; want it there only after a good build", err)
			}
			if tc.wantOK && strings.TrimSpace(stdout) != bin {
				t.Fatalf("stdout = %q, want the bin dir %s", stdout, bin)
			}
		})
	}
}

func writeFile(t *testing.T, path string, mode os.FileMode, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
