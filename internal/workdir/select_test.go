package workdir_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/workdir"
)

// files writes name → content under dir.
func files(t *testing.T, dir string, m map[string]string) {
	t.Helper()
	for name, body := range m {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A project after `gpupass up` (issue #31, finding 6): its state dir,
// keys, an .env and what .gitignore and .gpupassignore leave out stay
// home; the secrets are refused by name until included, and what is
// shipped is exactly the project's code.
func TestPackLeavesOutStateIgnoredAndSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	elsewhere := filepath.Join(dir, "runs", "state") // GPUPASS_STATE_DIR under the work dir
	token := "gpp_abcdefghijklmnopqrstuvwxyz234567"
	files(t, dir, map[string]string{
		"train.py":                         "print(1)",
		".gitignore":                       "/data/\n*.log\n!keep.log\nout/**\n",
		".gpupassignore":                   "notes.md\n!debug.log\nvenv\n",
		"notes.md":                         "x",
		"debug.log":                        "re-included by .gpupassignore",
		"keep.log":                         "negated",
		"run.log":                          "ignored",
		"data/big.bin":                     "x",
		"out/ckpt.pt":                      "x",
		"pkg/.gitignore":                   "/gen\n",
		"pkg/gen/x.py":                     "x",
		"pkg/m.py":                         "x",
		"pkg/sub/gen/y.py":                 "not anchored to pkg/: shipped",
		".gpupass/config.json":             `{"token": "` + token + `"}`,
		".gpupass/broker.db":               "db",
		"runs/state/tokens.json":           `{"agent": "` + token + `"}`,
		"elsewhere/" + workdir.StateMarker: "",
		"elsewhere/agents/a/x":             "x",
		"cosign.key":                       "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----",
		"tls/server.pem":                   "cert",
		".env":                             "API_KEY=1",
		".env.example":                     "API_KEY=",
		"deploy":                           "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n",
		"conf/config.json":                 `{"broker_url": "http://x", "token": "sekrit"}`,
		"leak.txt":                         "export GPUPASS_BROKER_TOKEN=" + token,
		"tokenizer.json":                   `{"tokens": ["a"]}`,
		"config.json":                      `{"hidden_size": 8}`,
	})
	// An ignored link is left out, not refused.
	if err := os.Symlink("/usr", filepath.Join(dir, "venv")); err != nil {
		t.Fatal(err)
	}
	o := workdir.PackOptions{MaxCompressed: bigArchive, StateDirs: []string{elsewhere}}
	_, err := workdir.Pack(dir, o)
	var se *workdir.SecretsError
	if !errors.As(err, &se) {
		t.Fatalf("Pack: %v, want a SecretsError", err)
	}
	refused := []string{".env", "conf/config.json", "cosign.key", "deploy", "leak.txt", "tls/server.pem"}
	got := se.Paths()
	slices.Sort(got)
	if diff := cmp.Diff(refused, got); diff != "" {
		t.Errorf("refused files (-want +got):\n%s\n%v", diff, err)
	}

	o.Include = []string{".env", "conf/config.json", "cosign.key", "deploy", "leak.txt", filepath.Join(dir, "tls", "server.pem")}
	packed, err := workdir.Pack(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"train.py", "tokenizer.json", ".env.example"} {
		if !slices.Contains(packed.Files, name) {
			t.Errorf("%s was not shipped: %v", name, packed.Files)
		}
	}
	dst := t.TempDir()
	if err := workdir.Unpack(packed.Archive, dst, workdir.Limits{}); err != nil {
		t.Fatal(err)
	}
	var shipped []string
	for p := range tree(t, dst) {
		shipped = append(shipped, p)
	}
	slices.Sort(shipped)
	want := []string{".env", ".env.example", ".gitignore", ".gpupassignore", "conf", "conf/config.json", "config.json", "cosign.key",
		"debug.log", "deploy", "keep.log", "leak.txt", "out", "pkg", "pkg/.gitignore", "pkg/m.py", "pkg/sub", "pkg/sub/gen", "pkg/sub/gen/y.py",
		"runs", "tls", "tls/server.pem", "tokenizer.json", "train.py"}
	if diff := cmp.Diff(want, shipped); diff != "" {
		t.Errorf("shipped (-want +got):\n%s", diff)
	}
	left := map[string]string{}
	for _, l := range packed.Left {
		left[l.Path] = l.Rule
	}
	wantLeft := map[string]string{
		".gpupass/":   "always (a gpupass state dir: database, tokens, agents' state)",
		"runs/state/": "always (a gpupass state dir: database, tokens, agents' state)",
		"elsewhere/":  "always (a gpupass state dir: database, tokens, agents' state)",
		"data/":       ".gitignore:1 /data/",
		"run.log":     ".gitignore:2 *.log",
		"out/ckpt.pt": ".gitignore:4 out/**",
		"notes.md":    ".gpupassignore:1 notes.md",
		"venv":        ".gpupassignore:3 venv",
		"pkg/gen/":    "pkg/.gitignore:1 /gen",
	}
	if diff := cmp.Diff(wantLeft, left); diff != "" {
		t.Errorf("left out (-want +got):\n%s", diff)
	}

	// An --include that names nothing refused is a typo, not a no-op.
	o.Include = append(o.Include, "nope.key")
	var ie *workdir.IncludeError
	if _, err := workdir.Pack(dir, o); !errors.As(err, &ie) || ie.Path != "nope.key" {
		t.Errorf("including a missing file: %v, want an IncludeError for nope.key", err)
	}
}
