package clientconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"XDG_CONFIG_HOME": "/x", "HOME": "/h"}, "/x/gpupass/config.yaml"},
		{map[string]string{"HOME": "/h"}, "/h/.config/gpupass/config.yaml"},
	}
	for _, tc := range tests {
		got, err := Path(func(k string) string { return tc.env[k] })
		if err != nil || got != tc.want {
			t.Errorf("Path(%v) = %q, %v; want %q", tc.env, got, err, tc.want)
		}
	}
	if _, err := Path(func(string) string { return "" }); err == nil {
		t.Error("no HOME and no XDG_CONFIG_HOME gave a path")
	}
}

// The file and its directory are the user's alone, and a round trip
// keeps every field.
func TestSaveLoad(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "cfg", "gpupass", FileName)
	c := &Config{Path: path}
	c.Set(Context{Name: "prod", BrokerURL: "https://b:7070", TokenFile: "/t/prod", TLSCA: "/t/ca.pem"})
	c.Set(Context{Name: "proj", StateDir: "/p/.gpupass"})
	c.CurrentContext = "prod"
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, st.Mode().Perm(), want)
		}
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if !got.Remove("prod") || got.CurrentContext != "" || len(got.Contexts) != 1 {
		t.Errorf("Remove(current) left %+v", got)
	}
	if _, err := got.Lookup("prod"); err == nil || !strings.Contains(err.Error(), "gpupass context ls") {
		t.Errorf("Lookup of a removed context: %v", err)
	}
}

// A token file that is missing or empty is an error naming the file and
// the command that fixes it; the token itself is never in an error.
func TestReadToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := &Config{Path: filepath.Join(dir, FileName)}
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("gpp_secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := c.ReadToken(&Context{Name: "a", TokenFile: "good"}); err != nil || tok != "gpp_secret" {
		t.Errorf("relative token file: %q, %v", tok, err)
	}
	for _, f := range []string{"missing", "empty"} {
		_, err := c.ReadToken(&Context{Name: "a", TokenFile: f})
		if err == nil {
			t.Errorf("token file %s accepted", f)
			continue
		}
		for _, want := range []string{filepath.Join(dir, f), "gpupass context set a --token-file FILE"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("token file %s: error %q lacks %q", f, err, want)
			}
		}
	}
}

func TestSafeName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"proj": "proj", "my proj": "my-proj", ".hidden": "hidden", "日本": "local", "": "local"} {
		if got := SafeName(in); got != want {
			t.Errorf("SafeName(%q) = %q, want %q", in, got, want)
		}
	}
}
