package localstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpupass/gpupass/internal/fsutil"
)

// Config is what `gpupass up` leaves for the other commands: where
// the local broker listens and a submit token for it. It lives in the
// state dir as config.json (mode 0600: it holds a secret).
type Config struct {
	BrokerURL string   `json:"broker_url"`
	Token     string   `json:"token"`
	Regions   []string `json:"regions"`
	StateDir  string   `json:"state_dir"`
	BrokerPID int      `json:"broker_pid,omitempty"`
	AgentPIDs []int    `json:"agent_pids,omitempty"`
}

// ConfigFile is the config's name inside the state dir.
const ConfigFile = "config.json"

// DefaultStateDir is where `gpupass up` keeps its state when no
// --state-dir is given, and where the other commands look for its
// config: $GPUPASS_STATE_DIR, else $XDG_STATE_HOME/gpupass, else the
// project's .gpupass (FindStateDir from the working directory), else
// .gpupass beside the project's spec (ProjectStateDir: `up` run from a
// subdirectory of a project that has no stack yet), else .gpupass in the
// working directory.
func DefaultStateDir(getenv func(string) string) string {
	cwd, err := os.Getwd()
	if err != nil {
		cwd = "."
	}
	return StateDirFrom(getenv, cwd)
}

// StateDirFrom is DefaultStateDir for the working directory cwd.
func StateDirFrom(getenv func(string) string, cwd string) string {
	if d := getenv("GPUPASS_STATE_DIR"); d != "" {
		return d
	}
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "gpupass")
	}
	if d := FindStateDir(cwd, getenv("HOME")); d != "" {
		return d
	}
	if d := ProjectStateDir(cwd, getenv("HOME")); d != "" {
		return d
	}
	return StateDirName
}

// ProjectSpecNames are the spec files whose directory is a project's
// root (validate.SpecFileNames).
var ProjectSpecNames = []string{"gpupass.yaml", "lightning-cloud.yaml"}

// ProjectStateDir is the state dir of the project cwd is in, found by
// its spec: the nearest directory from cwd up that holds one of
// ProjectSpecNames, within FindStateDir's bounds. StateDirName when the
// spec is in cwd, the absolute path when it is above, "" when there is
// none. Without it, `up` in a subdirectory of a project from `gpupass
// init` made a second stack there and printed `gpupass init &&`.
func ProjectStateDir(cwd, home string) string {
	return findUp(cwd, home, func(dir string) bool {
		for _, n := range ProjectSpecNames {
			if fi, err := os.Stat(filepath.Join(dir, n)); err == nil && fi.Mode().IsRegular() {
				return true
			}
		}
		return false
	})
}

// StateDirName is the state dir's name in a project.
const StateDirName = ".gpupass"

// FindStateDir walks up from cwd to the project's .gpupass directory, so
// that every command works from a subdirectory of the project. It looks
// in cwd and each parent, and stops after the first directory that is a
// git work tree's root (has .git: a .gpupass above it belongs to another
// project), after home (a .gpupass above $HOME is no user's project), or
// at the filesystem root. It returns StateDirName when the dir is in cwd
// itself (paths up prints stay as short as before), the absolute path
// when it is in a parent, and "" when there is none.
func FindStateDir(cwd, home string) string {
	return findUp(cwd, home, func(dir string) bool {
		st, err := os.Stat(filepath.Join(dir, StateDirName))
		return err == nil && st.IsDir()
	})
}

// findUp is fsutil.FindUp's directory as the state dir's path:
// StateDirName itself for cwd, else the absolute path; "" when none.
func findUp(cwd, home string, match func(dir string) bool) string {
	dir := fsutil.FindUp(cwd, home, match)
	if dir == "" {
		return ""
	}
	if abs, err := filepath.Abs(cwd); err == nil && abs == dir {
		return StateDirName
	}
	return filepath.Join(dir, StateDirName)
}

// LoadConfig reads the config `gpupass up` wrote in the default state
// dir; nil, nil when there is none.
func LoadConfig(getenv func(string) string) (*Config, error) {
	return ReadConfig(DefaultStateDir(getenv))
}

// ReadConfig reads the config `gpupass up` wrote in the state dir dir;
// nil, nil when there is none.
func ReadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, ConfigFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("reading %s: %w (delete it and run `gpupass up` again)", path, err)
	}
	return &c, nil
}

// WriteConfig writes c into the state dir dir and returns its path.
func WriteConfig(dir string, c *Config) (string, error) {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, ConfigFile)
	// Mode 0600: it holds the submit token.
	if err := fsutil.WriteFileAtomic(path, append(b, '\n'), 0o600); err != nil {
		return "", err
	}
	return path, nil
}
