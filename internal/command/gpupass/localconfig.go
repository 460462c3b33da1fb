package gpupass

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpupass/gpupass/internal/fsutil"
)

// LocalConfig is what `gpupass up` leaves for the other commands: where
// the local broker listens and a submit token for it. It lives in the
// state dir as config.json (mode 0600: it holds a secret).
type LocalConfig struct {
	BrokerURL string   `json:"broker_url"`
	Token     string   `json:"token"`
	Regions   []string `json:"regions"`
	StateDir  string   `json:"state_dir"`
	BrokerPID int      `json:"broker_pid,omitempty"`
	AgentPIDs []int    `json:"agent_pids,omitempty"`
}

// LocalConfigFile is the config's name inside the state dir.
const LocalConfigFile = "config.json"

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

// LoadLocalConfig reads the config `gpupass up` wrote in the default state
// dir; nil, nil when there is none.
func LoadLocalConfig(getenv func(string) string) (*LocalConfig, error) {
	path := filepath.Join(DefaultStateDir(getenv), LocalConfigFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var c LocalConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("reading %s: %w (delete it and run `gpupass up` again)", path, err)
	}
	return &c, nil
}

func writeLocalConfig(dir string, c *LocalConfig) (string, error) {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, LocalConfigFile)
	// Mode 0600: it holds the submit token.
	if err := fsutil.WriteFileAtomic(path, append(b, '\n'), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// fromLocal fills an unset broker URL and token from `gpupass up`'s
// config, so commands need no flags after `up`.
func (b *BrokerFlags) fromLocal() error {
	if b.URL != "" && b.Token != "" {
		return nil
	}
	c, err := LoadLocalConfig(os.Getenv)
	if err != nil || c == nil {
		return err
	}
	if b.URL == "" {
		b.URL = c.BrokerURL
		if b.Token == "" {
			b.Token = c.Token
		}
	}
	return nil
}
