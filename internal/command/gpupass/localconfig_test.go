package gpupass

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDefaultStateDir(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"XDG state home", map[string]string{"XDG_STATE_HOME": "/x/state"}, "/x/state/gpupass"},
		{"explicit dir wins", map[string]string{"XDG_STATE_HOME": "/x/state", "GPUPASS_STATE_DIR": "/y"}, "/y"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := DefaultStateDir(func(k string) string { return tc.env[k] })
			if got != tc.want {
				t.Errorf("DefaultStateDir = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLocalConfigRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := func(k string) string {
		if k == "GPUPASS_STATE_DIR" {
			return dir
		}
		return ""
	}
	if c, err := LoadLocalConfig(env); err != nil || c != nil {
		t.Fatalf("LoadLocalConfig with no file = %v, %v; want nil, nil", c, err)
	}
	want := &LocalConfig{BrokerURL: "http://127.0.0.1:7070", Token: "gpp_secret", Regions: []string{"us-west-2"}, StateDir: dir, BrokerPID: 42}
	path, err := writeLocalConfig(dir, want)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("config mode %v, want 0600 (it holds a token)", st.Mode().Perm())
	}
	got, err := LoadLocalConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config round trip (-want +got):\n%s", diff)
	}
	if err := os.WriteFile(filepath.Join(dir, LocalConfigFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadLocalConfig(env); err == nil {
		t.Error("a broken config.json was accepted")
	}
}
