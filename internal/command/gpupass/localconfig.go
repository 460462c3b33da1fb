package gpupass

import (
	"os"

	"github.com/gpupass/gpupass/internal/app/localstack"
)

// LocalConfig is what `gpupass up` leaves for the other commands.
type LocalConfig = localstack.Config

// LocalConfigFile is the config's name inside the state dir.
const LocalConfigFile = localstack.ConfigFile

// DefaultStateDir is where `gpupass up` keeps its state when no
// --state-dir is given.
func DefaultStateDir(getenv func(string) string) string { return localstack.DefaultStateDir(getenv) }

// LoadLocalConfig reads the config `gpupass up` wrote in the default state
// dir; nil, nil when there is none.
func LoadLocalConfig(getenv func(string) string) (*LocalConfig, error) {
	return localstack.LoadConfig(getenv)
}

func writeLocalConfig(dir string, c *LocalConfig) (string, error) {
	return localstack.WriteConfig(dir, c)
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
