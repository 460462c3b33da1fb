package gpupass

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpupass/gpupass/internal/app/localstack"
	"github.com/gpupass/gpupass/internal/clientconfig"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// LocalConfig is what `gpupass up` leaves for the other commands.
type LocalConfig = localstack.Config

// LocalConfigFile is the config's name inside the state dir.
const LocalConfigFile = localstack.ConfigFile

// DefaultStateDir is where `gpupass up` keeps its state when no
// --state-dir is given, and where the other commands look for it: the
// project's .gpupass is found from its subdirectories.
func DefaultStateDir(getenv func(string) string) string { return localstack.DefaultStateDir(getenv) }

// LoadLocalConfig reads the config `gpupass up` wrote in the default state
// dir; nil, nil when there is none.
func LoadLocalConfig(getenv func(string) string) (*LocalConfig, error) {
	return localstack.LoadConfig(getenv)
}

func writeLocalConfig(dir string, c *LocalConfig) (string, error) {
	return localstack.WriteConfig(dir, c)
}

// contextEnv sets --context.
var contextEnv = EnvName("context")

// fromLocal fills an unset broker URL (and with it the token and CA)
// from, highest first:
//
//  1. --broker-url, --broker-token (set before this runs)
//  2. GPUPASS_BROKER_URL, GPUPASS_BROKER_TOKEN(_FILE) (likewise)
//  3. the context --context or GPUPASS_CONTEXT names
//  4. the config of a `gpupass up` stack in the state dir:
//     GPUPASS_STATE_DIR, $XDG_STATE_HOME/gpupass, or the project's
//     .gpupass found from the working directory up
//  5. the current context of the config file (gpupass context use)
//
// The token comes from where the URL came from: a broker given by flag
// never receives a local stack's or a context's token, and a token given
// by flag or environment is never sent to a broker that a context or a
// .gpupass directory (which a cloned repository could hold) chose.
func (b *BrokerFlags) fromLocal() error {
	if b.URL != "" {
		return nil
	}
	if b.Token != "" {
		defer func() {
			if b.URL != "" {
				b.URL, b.Token = "", ""
			}
		}()
		if err := b.fromLower(); err != nil || b.URL == "" {
			return err
		}
		// The token may have come from any of three places, which
		// flagenv does not tell apart: the fix names all three.
		env := EnvName("broker-token")
		return fmt.Errorf("--broker-token (or %s or %s_FILE) is set without --broker-url: it is not sent to %s, the broker of %s; pass --broker-url with it, or, to use that broker's own token, leave out --broker-token and run: unset %s %s_FILE",
			env, env, b.URL, b.source, env, env)
	}
	return b.fromLower()
}

// fromLower fills URL, token and CA from the first of sources 3 to 5
// that has a broker, and records which in b.source.
func (b *BrokerFlags) fromLower() error {
	getenv := b.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if name := b.contextName(getenv); name != "" {
		cfg, err := loadClientConfig(getenv)
		if err != nil {
			return err
		}
		x, err := cfg.Lookup(name)
		if err != nil {
			return fmt.Errorf("--context: %w", err)
		}
		b.source = fmt.Sprintf("context %s (--context or %s)", x.Name, contextEnv)
		return b.fromContext(cfg, x)
	}
	dir := DefaultStateDir(getenv) // a walk up the directories: once
	c, err := localstack.ReadConfig(dir)
	if err != nil {
		return err
	}
	if c != nil {
		b.source = "the stack in " + dir
		b.fill(c.BrokerURL, c.Token, "")
		return nil
	}
	path, err := clientconfig.Path(getenv)
	if err != nil {
		return nil // no config file can exist: nothing to fall back on
	}
	cfg, err := clientconfig.Load(path)
	if err != nil || cfg.CurrentContext == "" {
		return err
	}
	x, err := cfg.Lookup(cfg.CurrentContext)
	if err != nil {
		return fmt.Errorf("current context: %w (or pick another: gpupass context use NAME)", err)
	}
	b.source = "the current context " + x.Name
	return b.fromContext(cfg, x)
}

// contextName is --context, which GPUPASS_CONTEXT sets too; for flags
// built without a command (ci, audit), GPUPASS_CONTEXT alone.
func (b *BrokerFlags) contextName(getenv func(string) string) string {
	if b.cmd != nil {
		if f := b.cmd.Flag("context"); f != nil {
			return f.Value.String()
		}
	}
	return getenv(contextEnv)
}

func (b *BrokerFlags) fill(url, token, ca string) {
	b.URL, b.Token = url, token
	if b.TLSCA == "" {
		b.TLSCA = ca
	}
}

// fromContext fills the broker from context x of cfg.
func (b *BrokerFlags) fromContext(cfg *clientconfig.Config, x *clientconfig.Context) error {
	if x.StateDir != "" {
		dir := cfg.Abs(x.StateDir)
		c, err := localstack.ReadConfig(dir)
		if err != nil {
			return fmt.Errorf("context %q: %w", x.Name, err)
		}
		if c == nil {
			return fmt.Errorf("context %q: its stack has no %s (not up): start it with gpupass up --state-dir %s", x.Name,
				filepath.Join(dir, LocalConfigFile), termsafe.ShellQuote(dir))
		}
		b.fill(c.BrokerURL, c.Token, cfg.Abs(x.TLSCA))
		return nil
	}
	if x.BrokerURL == "" {
		return fmt.Errorf("context %q in %s has no broker-url: gpupass context set %s --broker-url URL --token-file FILE", x.Name, cfg.Path, x.Name)
	}
	token, err := cfg.ReadToken(x)
	if err != nil {
		return err
	}
	if token == "" {
		return fmt.Errorf("context %q in %s has no token-file: gpupass context set %s --token-file FILE", x.Name, cfg.Path, x.Name)
	}
	b.fill(x.BrokerURL, token, cfg.Abs(x.TLSCA))
	return nil
}

// loadClientConfig reads the config file of contexts.
func loadClientConfig(getenv func(string) string) (*clientconfig.Config, error) {
	path, err := clientconfig.Path(getenv)
	if err != nil {
		return nil, err
	}
	return clientconfig.Load(path)
}
