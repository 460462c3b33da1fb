package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/internal/command/docsgen"
	"github.com/gpupass/gpupass/internal/command/executorflags"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestCLIReferenceIsCurrent fails when a command, flag or help text
// changed and docs/cli was not regenerated (or was edited by hand), or
// when an executor's flags changed and the list gpupass up embeds
// (executorflags.File) was not.
func TestCLIReferenceIsCurrent(t *testing.T) {
	t.Parallel()
	want, es, err := executors()
	if err != nil {
		t.Fatal(err)
	}
	if err := docsgen.Check(filepath.Join(testutil.RepoRoot(t), dir), trees(es)); err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), executorflags.File))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, want) {
		t.Fatalf("%s is stale: the agent's executors' flags changed; run make docs", executorflags.File)
	}
}

// TestEveryBinaryDocumented: a new binary in cmd/ gets its reference, or
// is named here with the reason it has none.
func TestEveryBinaryDocumented(t *testing.T) {
	t.Parallel()
	undocumented := map[string]string{
		"gpupass-docs": "this generator",
	}
	documented := map[string]bool{}
	for _, tr := range trees(nil) {
		documented[tr.Command.Name()] = true
	}
	entries, err := os.ReadDir(filepath.Join(testutil.RepoRoot(t), "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !documented[e.Name()] && undocumented[e.Name()] == "" {
			t.Errorf("cmd/%s has no CLI reference: add its command tree to trees() in cmd/gpupass-docs/main.go and run make docs", e.Name())
		}
	}
}
