package k8stest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// Issue #32, item 7: scripts/k8s-up.sh as root installs the Debian
// packages it lacks, as `make demo` does (scripts/lib.sh need_apt), where
// it used to print an apt-get line and stop. The test hides etcd from
// PATH and gives the script a dpkg-query that calls etcd-server not
// installed and an apt-get that records its arguments and "installs"
// etcd; the script's run directory is a temp dir and its Kubernetes
// binaries an empty dir, so it stops at its first kubectl call, past the
// packages, and never touches the shared cluster.
func TestUpScriptInstallsMissingPackagesAsRoot(t *testing.T) {
	t.Parallel()
	testutil.Prereqs{Root: "k8s-up.sh needs root", Tools: []string{"bash", "flock", "openssl", "go"}}.Require(t)
	dir := t.TempDir()
	bin, fake, kbin := filepath.Join(dir, "usrbin"), filepath.Join(dir, "fake"), filepath.Join(dir, "kbin")
	for _, d := range []string{bin, fake, kbin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// /usr/bin without etcd (and without the real apt-get and dpkg-query).
	ents, err := os.ReadDir("/usr/bin")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch e.Name() {
		case "etcd", "apt-get", "dpkg-query":
			continue
		}
		if err := os.Symlink(filepath.Join("/usr/bin", e.Name()), filepath.Join(bin, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		testutil.Missing(t, "etcd not installed (scripts/setup.d/70-kubernetes.sh)")
	}
	aptLog := filepath.Join(dir, "apt.log")
	writeFile(t, filepath.Join(fake, "dpkg-query"), 0o755, `#!/bin/sh
# every package installed but etcd-server, until apt-get installs it
for p; do :; done
if [ "$p" = etcd-server ] && [ ! -e `+shellQuote(filepath.Join(fake, "etcd"))+` ]; then exit 1; fi
echo "install ok installed"
`)
	writeFile(t, filepath.Join(fake, "apt-get"), 0o755, `#!/bin/sh
echo "apt-get $*" >>`+shellQuote(aptLog)+`
case "$*" in *install*etcd-server*) ln -s `+shellQuote(etcd)+` `+shellQuote(filepath.Join(fake, "etcd"))+` ;; esac
`)
	goDir := filepath.Dir(testutil.Tool(t, "go"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(testutil.RepoRoot(t), "scripts", "k8s-up.sh"))
	cmd.Env = []string{"PATH=" + strings.Join([]string{fake, bin, "/usr/sbin", goDir}, ":"), "HOME=" + os.Getenv("HOME"),
		"GPUPASS_K8S_RUN=" + filepath.Join(dir, "run"), "GPUPASS_K8S_BIN=" + kbin, "GPUPASS_K8S_API_PORT=1"}
	stdout, stderr, code := testutil.Run(t, cmd)
	apt, _ := os.ReadFile(aptLog)
	if !strings.Contains(string(apt), "apt-get install -y -qq --no-install-recommends etcd-server") {
		t.Errorf("k8s-up.sh did not apt-get install etcd-server (exit %d); apt-get calls:\n%s\nstderr:\n%s", code, apt, stderr)
	}
	if strings.Contains(stderr, "not found; install") {
		t.Errorf("k8s-up.sh as root stopped at a missing package instead of installing it:\n%s", stderr)
	}
	if stdout != "" && code != 0 {
		t.Errorf("k8s-up.sh wrote to stdout (eval'd by callers) before failing: %q", stdout)
	}
}
