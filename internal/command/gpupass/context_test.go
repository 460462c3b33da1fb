package gpupass

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/clientconfig"
)

// up saves its stack as a context named after the project; a second
// project of the same name gets -2 and leaves the current context alone,
// and the line up prints says how to switch, as a command that works.
func TestRegisterStack(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	getenv := func(k string) string { return map[string]string{"XDG_CONFIG_HOME": filepath.Join(home, "cfg")}[k] }
	a := filepath.Join(home, "a", "proj", ".gpupass")
	b := filepath.Join(home, "b", "proj", ".gpupass")
	other := filepath.Join(home, "state")

	sa, err := registerStack(getenv, a)
	if err != nil {
		t.Fatal(err)
	}
	if sa.Name != "proj" || !sa.Current || !strings.Contains(sa.line(), "context proj  (current;") {
		t.Errorf("first stack: %+v, %q", sa, sa.line())
	}
	sb, err := registerStack(getenv, b)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Name != "proj-2" || sb.Current || sb.Was != "proj" || !strings.HasSuffix(sb.line(), "gpupass context use proj-2)") {
		t.Errorf("second stack of the same name: %+v, %q", sb, sb.line())
	}
	if again, err := registerStack(getenv, a); err != nil || again.Name != "proj" {
		t.Errorf("the first stack again: %+v, %v", again, err)
	}
	if so, err := registerStack(getenv, other); err != nil || so.Name != "local" {
		t.Errorf("a state dir not called .gpupass: %+v, %v", so, err)
	}
	path, _ := clientconfig.Path(getenv)
	cfg, err := clientconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Names(), " "); got != "proj proj-2 local" || cfg.CurrentContext != "proj" {
		t.Errorf("contexts %q, current %q", got, cfg.CurrentContext)
	}
	if x, _ := cfg.Get("proj-2"); x.StateDir != b {
		t.Errorf("proj-2 names %q, want %q", x.StateDir, b)
	}
	// A config file up cannot read is reported, not overwritten.
	if err := os.WriteFile(path, []byte("contexts: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := registerStack(getenv, a); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a broken config file: %v", err)
	}
}
