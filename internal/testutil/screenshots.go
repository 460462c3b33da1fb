package testutil

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// ToolsDir is the directory scripts/setup.d installs npm tools into
// (Node 22, gitlab-ci-local, mermaid, marked): $GPUPASS_TOOLS_DIR, else
// ~/.cache/gpupass-tools.
func ToolsDir() string {
	if dir := os.Getenv("GPUPASS_TOOLS_DIR"); dir != "" {
		return dir
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "gpupass-tools")
}

// UpdateScreenshotsEnv, set to 1 (`make screenshots`), makes browser tests
// write the screenshots the docs show into docs/img.
const UpdateScreenshotsEnv = "GPUPASS_UPDATE_SCREENSHOTS"

// Shots is where a browser test keeps its screenshots.
type Shots struct {
	// Dir holds every screenshot: $GPUPASS_TEST_ARTIFACTS/<sub>, else a
	// temporary directory.
	Dir  string
	docs map[string]string
	img  string // docs/img when updating, else ""

	mu    sync.Mutex
	saved map[string]bool
}

// Screenshots returns the test's screenshot place under sub. docs maps
// a screenshot's name to the file under docs/img that the README and docs
// show: with GPUPASS_UPDATE_SCREENSHOTS=1 those are written there too,
// and the test fails at its end if one was not taken, so `make
// screenshots` never leaves a stale image behind. Without it the
// repository is never written (make test runs these tests).
func Screenshots(t testing.TB, sub string, docs map[string]string) *Shots {
	t.Helper()
	dir := os.Getenv("GPUPASS_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	s := &Shots{Dir: filepath.Join(dir, sub), docs: docs, saved: map[string]bool{}}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", s.Dir)
	if os.Getenv(UpdateScreenshotsEnv) == "1" {
		s.img = filepath.Join(RepoRoot(t), "docs", "img")
		t.Cleanup(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			var missing []string
			for name, file := range docs {
				if !s.saved[name] {
					missing = append(missing, file)
				}
			}
			if len(missing) > 0 && !t.Failed() {
				slices.Sort(missing)
				t.Errorf("%s=1: not retaken: docs/img/%s", UpdateScreenshotsEnv, strings.Join(missing, ", docs/img/"))
			}
		})
	}
	return s
}

// Save writes a PNG as name.png, and over its docs/img file when
// updating.
func (s *Shots) Save(t testing.TB, name string, png []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(s.Dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	file, ok := s.docs[name]
	if !ok || s.img == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(s.img, file), png, 0o644); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.saved[name] = true
	s.mu.Unlock()
	t.Logf("wrote docs/img/%s", file)
}
