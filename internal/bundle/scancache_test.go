package bundle_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

// Not parallel: it reads a package-wide counter and sets the racy window.
func TestScanCache(t *testing.T) {
	bundle.SetRacyWindow(0)
	t.Cleanup(func() { bundle.SetRacyWindow(2e9) })
	ctx := context.Background()
	dir := wheelhouse(t, 3)
	cache := filepath.Join(t.TempDir(), "scan.json")
	o := bundle.ScanOptions{Jobs: 2, Cache: cache}

	before := bundle.WheelsRead.Load()
	first, err := bundle.Scan(ctx, dir, o)
	if err != nil {
		t.Fatal(err)
	}
	if got := bundle.WheelsRead.Load() - before; got != 3 {
		t.Fatalf("first scan read %d wheels, want 3", got)
	}
	before = bundle.WheelsRead.Load()
	second, err := bundle.Scan(ctx, dir, o)
	if err != nil {
		t.Fatal(err)
	}
	if got := bundle.WheelsRead.Load() - before; got != 0 {
		t.Errorf("unchanged rescan read %d wheels, want 0", got)
	}
	for i := range first {
		if first[i].SHA256 != second[i].SHA256 || first[i].Size != second[i].Size {
			t.Errorf("%s: cached %s/%d, scanned %s/%d", first[i].File, second[i].SHA256, second[i].Size, first[i].SHA256, first[i].Size)
		}
	}

	// Rewriting a wheel (here: one whose RECORD now lies) is noticed.
	victim := first[1].File
	dist := strings.SplitN(victim, "-", 2)[0]
	if _, err := wheeltest.Write(dir, victim, dist, "1.0",
		[]wheeltest.File{{Name: dist + "/__init__.py", Data: strings.NewReader("x = 2\n")}}, wheeltest.Options{LieAbout: dist + "/__init__.py"}); err != nil {
		t.Fatal(err)
	}
	before = bundle.WheelsRead.Load()
	if _, err := bundle.Scan(ctx, dir, o); err == nil || !strings.Contains(err.Error(), victim) {
		t.Fatalf("rescan after a rewrite: %v, want the lying RECORD of %s", err, victim)
	}
	if got := bundle.WheelsRead.Load() - before; got != 1 {
		t.Errorf("rescan read %d wheels, want only the rewritten one", got)
	}

	// A corrupt cache file is ignored, not trusted.
	if err := os.WriteFile(cache, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, victim))
	if _, err := bundle.Scan(ctx, dir, o); err != nil {
		t.Fatal(err)
	}
}
