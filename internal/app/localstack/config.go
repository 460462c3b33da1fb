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
// --state-dir is given: $GPUPASS_STATE_DIR, else $XDG_STATE_HOME/gpupass,
// else .gpupass in the working directory.
func DefaultStateDir(getenv func(string) string) string {
	if d := getenv("GPUPASS_STATE_DIR"); d != "" {
		return d
	}
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "gpupass")
	}
	return ".gpupass"
}

// LoadConfig reads the config `gpupass up` wrote in the default state
// dir; nil, nil when there is none.
func LoadConfig(getenv func(string) string) (*Config, error) {
	path := filepath.Join(DefaultStateDir(getenv), ConfigFile)
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
