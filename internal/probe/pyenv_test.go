package probe_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/probe"
)

// TestInstalledVersions reads versions the way importlib.metadata finds
// them along sys.path: dist-info METADATA, egg-info dirs and files, the
// first directory that has the name wins, and metadata naming another
// distribution is not believed.
func TestInstalledVersions(t *testing.T) {
	t.Parallel()
	first, second := t.TempDir(), t.TempDir()
	write := func(p, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	meta := func(name, v string) string {
		return "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + v + "\n\nVersion: 9.9 (body)\n"
	}
	write(filepath.Join(first, "Flash_Attn-2.5.5.dist-info", "METADATA"), meta("flash-attn", "2.5.5"))
	write(filepath.Join(second, "flash_attn-1.0.dist-info", "METADATA"), meta("flash-attn", "1.0"))
	write(filepath.Join(second, "numpy-1.24.2.egg-info"), meta("numpy", "1.24.2"))
	write(filepath.Join(second, "python_apt-2.6.0.egg-info", "PKG-INFO"), meta("python-apt", "2.6.0"))
	write(filepath.Join(first, "torch-2.1.0.dist-info", "METADATA"), meta("not-torch", "6.6.6"))
	write(filepath.Join(second, "torch-2.1.0+cu121.dist-info", "METADATA"), meta("torch", "2.1.0+cu121"))
	got := probe.InstalledVersions([]string{first, filepath.Join(first, "missing"), second}, []string{"flash-attn", "NumPy", "python_apt", "torch", "absent"})
	want := map[string]string{"flash-attn": "2.5.5", "numpy": "1.24.2", "python-apt": "2.6.0", "torch": "2.1.0+cu121", "absent": ""}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("InstalledVersions (-want +got):\n%s", diff)
	}
}
