// Package sigstoretest gives tests a real, private Sigstore instance: the
// services the public-good instance runs, built from the Go module proxy
// by scripts/sigstore-build.sh and started for one test in a network
// namespace of its own (netnstest), with an OIDC issuer of this package
// that signs GitHub Actions and GitLab CI tokens. Keyless signing and
// verification run against it exactly as against sigstore.dev: through a
// signing config and a trusted root written by the stock cosign CLI.
//
// Why a namespace: the timestamp authority serves its metrics on :2112 of
// every interface and exits when that port is taken, so two stacks (two
// test packages at once) could not share one network stack; in its own
// namespace each service keeps its usual fixed port and nothing outside
// the test can reach it.
package sigstoretest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	_ "embed"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/netnstest"
)

// Component is one service of the stack, as scripts/sigstore-build.sh
// builds it: GOBIN=<cache>/<Name>-<Version>/bin go install Package@Version.
type Component struct {
	Name, Version, Package, Binary string
}

// Components are the versions the keyless tests run (issue #37 names them;
// rekor-tiles v2.3.0 refuses the DSSE entries attestations need).
var Components = []Component{
	{"fulcio", "v1.8.8", "github.com/sigstore/fulcio", "fulcio"},
	{"rekor-tiles", "v2.2.1", "github.com/sigstore/rekor-tiles/v2/cmd/rekor-server/posix", "posix"},
	{"timestamp-authority", "v2.1.3", "github.com/sigstore/timestamp-authority/v2/cmd/timestamp-server", "timestamp-server"},
	{"tesseract", "v0.1.1", "github.com/transparency-dev/tesseract/cmd/tesseract/posix", "posix"},
}

// The services' ports inside the stack's namespace.
const (
	fulcioPort  = 5555
	rekorPort   = 3000
	tsaPort     = 3004
	ctPort      = 6962
	metricsBase = 2113 // Fulcio's and Rekor's; the TSA's is fixed at 2112
)

// CacheRoot is where scripts/sigstore-build.sh puts the binaries.
func CacheRoot() string {
	if root := os.Getenv("GPUPASS_SIGSTORE_CACHE"); root != "" {
		return root
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "gpupass", "sigstore")
}

// Path is where c's binary is cached.
func (c Component) Path() string {
	return filepath.Join(CacheRoot(), c.Name+"-"+c.Version, "bin", c.Binary)
}

// Stack is a running private Sigstore instance.
type Stack struct {
	// Dir holds the keys, the services' storage and logs (<name>.log),
	// and the two files below.
	Dir string
	// TrustedRoot and SigningConfig are the files `cosign trusted-root
	// create` and `cosign signing-config create` wrote for this stack:
	// what --trusted-root and --signing-config take.
	TrustedRoot, SigningConfig         string
	FulcioURL, RekorURL, TSAURL, CTURL string
	// GitHubIssuer and GitLabIssuer are the OIDC issuers Fulcio trusts,
	// as a certificate names them (--certificate-oidc-issuer).
	GitHubIssuer, GitLabIssuer string

	oidc *issuer
}

var buildMu sync.Mutex

// binaries returns each component's binary, waiting for a build that
// setup started (scripts/setup.d/06-sigstore-build.sh), or stops the test
// as testutil.Missing does when one is not built.
func binaries(t testing.TB) map[string]string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	missing := func() string {
		for _, c := range Components {
			if _, err := os.Stat(c.Path()); err != nil {
				return c.Name + " " + c.Version
			}
		}
		return ""
	}
	if missing() != "" && buildRunning() {
		t.Logf("waiting for the Sigstore stack's build (scripts/sigstore-build.sh; log in %s)", filepath.Join(CacheRoot(), "build.log"))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		b, err := exec.CommandContext(ctx, filepath.Join(testutil.RepoRoot(t), "scripts", "sigstore-build.sh")).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("scripts/sigstore-build.sh: %v\n%s", err, b)
		}
	}
	if m := missing(); m != "" {
		testutil.Missing(t, "%s not built in %s (scripts/sigstore-build.sh builds the Sigstore stack once; scripts/setup.d/06-sigstore-build.sh runs it)", m, CacheRoot())
	}
	bins := map[string]string{}
	for _, c := range Components {
		bins[c.Name] = c.Path()
	}
	return bins
}

func buildRunning() bool {
	f, err := os.Open(filepath.Join(CacheRoot(), ".build.lock"))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// Start runs the stack until the test ends: Fulcio (an ephemeral CA, the
// test issuers), Rekor v2 (rekor-tiles on files), a timestamp authority
// (an in-memory signer) and TesseraCT as Fulcio's CT log, then writes the
// trusted root and signing config with the stock cosign CLI.
func Start(t testing.TB) *Stack {
	t.Helper()
	bins := binaries(t)
	cosign := testutil.Tool(t, "cosign")
	ipBin := testutil.Tool(t, "ip")
	ns := netnstest.New(t)
	dir := t.TempDir()
	s := &Stack{
		Dir:       dir,
		FulcioURL: fmt.Sprintf("http://%s:%d", ns.PeerIP, fulcioPort),
		RekorURL:  fmt.Sprintf("http://%s:%d", ns.PeerIP, rekorPort),
		TSAURL:    fmt.Sprintf("http://%s:%d/api/v1/timestamp", ns.PeerIP, tsaPort),
		CTURL:     fmt.Sprintf("http://%s:%d", ns.PeerIP, ctPort),
	}
	s.oidc = startIssuer(t, ns.HostIP)
	s.GitHubIssuer, s.GitLabIssuer = s.oidc.url+"/github", s.oidc.url+"/gitlab"

	rekorPub := writeKey(t, filepath.Join(dir, "rekor.key"), "PRIVATE KEY")
	ctPub := writeKey(t, filepath.Join(dir, "ct.key"), "EC PRIVATE KEY")
	fulcioCfg := filepath.Join(dir, "fulcio.yaml")
	if err := os.WriteFile(fulcioCfg, fulcioConfig(s.GitHubIssuer, s.GitLabIssuer), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"rekor", "ct"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exited := map[string]chan struct{}{}
	run := func(name string, args ...string) {
		t.Helper()
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		// ip netns exec enters the namespace and execs the service: the
		// PID is the service's own.
		cmd := exec.Command(ipBin, append([]string{"netns", "exec", ns.Name}, args...)...)
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", name, err)
		}
		done := make(chan struct{})
		exited[name] = done
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-done
			logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("%s's log:\n%s", name, tail(string(b), 3000))
			}
		})
	}
	peer := ns.PeerIP
	run("timestamp-authority", bins["timestamp-authority"], "serve",
		"--host", peer, "--port", fmt.Sprint(tsaPort), "--timestamp-signer", "memory",
		"--disable-ntp-monitoring", "--log-type", "prod")
	// --hostname is the checkpoint origin: sigstore-go checks it against
	// the host of the log's URL in the trusted root.
	run("rekor", bins["rekor-tiles"], "serve",
		"--hostname", peer, "--http-address", peer, "--http-port", fmt.Sprint(rekorPort),
		"--grpc-address", "127.0.0.1", "--grpc-port", fmt.Sprint(rekorPort+1),
		"--http-metrics-port", fmt.Sprint(metricsBase+1),
		"--storage-dir", filepath.Join(dir, "rekor"), "--signer-filepath", filepath.Join(dir, "rekor.key"),
		"--checkpoint-interval", "200ms", "--batch-max-age", "50ms", "--log-level", "warn")
	// Fulcio submits to the CT log only when it issues a certificate:
	// the log can start after it, with Fulcio's ephemeral root as the
	// one root it accepts.
	run("fulcio", bins["fulcio"], "serve", "--ca", "ephemeralca", "--config-path", fulcioCfg,
		"--host", peer, "--port", fmt.Sprint(fulcioPort), "--grpc-host", "127.0.0.1", "--grpc-port", fmt.Sprint(fulcioPort+1),
		"--metrics-port", fmt.Sprint(metricsBase), "--legacy-unix-domain-socket", filepath.Join(dir, "fulcio-legacy.sock"),
		"--ct-log-url", s.CTURL, "--ct-log-public-key-path", ctPub)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fulcioChain := filepath.Join(dir, "fulcio-chain.pem")
	tsaChain := filepath.Join(dir, "tsa-chain.pem")
	fetch(t, ctx, exited["fulcio"], "fulcio", s.FulcioURL+"/api/v1/rootCert", fulcioChain)
	fetch(t, ctx, exited["timestamp-authority"], "timestamp-authority", s.TSAURL+"/certchain", tsaChain)
	run("tesseract", bins["tesseract"], "--http_endpoint", fmt.Sprintf("%s:%d", peer, ctPort),
		"--origin", peer, "--storage_dir", filepath.Join(dir, "ct"),
		"--private_key", filepath.Join(dir, "ct.key"), "--roots_pem_file", fulcioChain,
		"--ext_key_usages", "CodeSigning", "--checkpoint_interval", "200ms")
	waitOK(t, ctx, exited["rekor"], "rekor", s.RekorURL+"/healthz")
	waitOK(t, ctx, exited["tesseract"], "tesseract", s.CTURL+"/healthz")

	start := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	s.TrustedRoot = filepath.Join(dir, "trusted_root.json")
	s.SigningConfig = filepath.Join(dir, "signing_config.json")
	cosignRun := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, cosign, args...)
		cmd.Env = append(os.Environ(), "HOME="+dir, "TUF_ROOT="+filepath.Join(dir, "tuf"))
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cosign %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	cosignRun("trusted-root", "create",
		"--fulcio", "url="+s.FulcioURL+",certificate-chain="+fulcioChain+",start-time="+start,
		"--rekor", "url="+s.RekorURL+",public-key="+rekorPub+",start-time="+start+",origin="+peer,
		"--ctfe", "url="+s.CTURL+",public-key="+ctPub+",start-time="+start,
		"--tsa", "url="+s.TSAURL+",certificate-chain="+tsaChain+",start-time="+start,
		"--out", s.TrustedRoot)
	cosignRun("signing-config", "create",
		"--fulcio", "url="+s.FulcioURL+",api-version=1,start-time="+start+",operator=gpupass-test",
		"--rekor", "url="+s.RekorURL+",api-version=2,start-time="+start+",operator=gpupass-test", "--rekor-config", "ANY",
		"--oidc-provider", "url="+s.GitHubIssuer+",api-version=1,start-time="+start+",operator=gpupass-test",
		"--tsa", "url="+s.TSAURL+",api-version=1,start-time="+start+",operator=gpupass-test", "--tsa-config", "ANY",
		"--out", s.SigningConfig)
	return s
}

// writeKey writes a new P-256 private key as PEM of the given type and
// its public key beside it (.pub), returning the public key's path.
func writeKey(t testing.TB, path, pemType string) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var der []byte
	if pemType == "EC PRIVATE KEY" {
		der, err = x509.MarshalECPrivateKey(k)
	} else {
		der, err = x509.MarshalPKCS8PrivateKey(k)
	}
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPath := strings.TrimSuffix(path, ".key") + ".pub"
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		t.Fatal(err)
	}
	return pubPath
}

// fetch GETs url until it answers 200 (the service is up) and writes the
// body to path.
func fetch(t testing.TB, ctx context.Context, exited <-chan struct{}, what, url, path string) {
	t.Helper()
	b := waitOK(t, ctx, exited, what, url)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitOK GETs url until it answers 200, and fails the test when the
// service exits first.
func waitOK(t testing.TB, ctx context.Context, exited <-chan struct{}, what, url string) []byte {
	t.Helper()
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && rerr == nil {
				return b
			}
			err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not come up at %s: %v", what, url, last)
		case <-exited:
			t.Fatalf("%s exited before it answered at %s (its log follows)", what, url)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

//go:embed fulcio-config.yaml
var fulcioConfigTemplate string

// fulcioConfig is Fulcio's identity config trusting the stack's issuers.
func fulcioConfig(github, gitlab string) []byte {
	return []byte(strings.NewReplacer("GITHUB_ISSUER", github, "GITLAB_ISSUER", gitlab).Replace(fulcioConfigTemplate))
}
