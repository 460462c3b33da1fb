// Package clientconfig is the gpupass CLI's own configuration: named
// contexts, each a broker and where its token is, in
// $XDG_CONFIG_HOME/gpupass/config.yaml (else ~/.config/gpupass), the way
// kubectl keeps clusters in a kubeconfig. A context names a token file,
// or the state dir of a `gpupass up` stack; it holds a token inline only
// when a user writes one in. It does no network I/O.
package clientconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/gpupass/gpupass/internal/fsutil"
)

// Context is one named broker.
type Context struct {
	Name string `yaml:"name"`
	// BrokerURL is the broker (a comma-separated list for replicas).
	BrokerURL string `yaml:"broker-url,omitempty"`
	// TokenFile holds the token (one line); relative paths are relative
	// to the config file's directory.
	TokenFile string `yaml:"token-file,omitempty"`
	// Token is a token written in by hand; gpupass never writes one.
	Token string `yaml:"token,omitempty"`
	// TLSCA is a PEM file of CAs to trust for an https broker.
	TLSCA string `yaml:"tls-ca,omitempty"`
	// StateDir is a `gpupass up` stack's state dir: its config.json has
	// the broker URL and token, so a restarted stack is followed.
	StateDir string `yaml:"state-dir,omitempty"`
}

// Config is config.yaml.
type Config struct {
	CurrentContext string    `yaml:"current-context,omitempty"`
	Contexts       []Context `yaml:"contexts"`

	// Path is where the config was read from and is saved to.
	Path string `yaml:"-"`
}

// FileName is the config's name in its directory.
const FileName = "config.yaml"

// Path is the config file: $XDG_CONFIG_HOME/gpupass/config.yaml, else
// $HOME/.config/gpupass/config.yaml.
func Path(getenv func(string) string) (string, error) {
	if d := getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "gpupass", FileName), nil
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "gpupass", FileName), nil
	}
	return "", errors.New("neither XDG_CONFIG_HOME nor HOME is set: set one so gpupass has a place for its contexts")
}

// Load reads the config at path; a missing file is an empty config.
func Load(path string) (*Config, error) {
	c := &Config{Path: path}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if err := yaml.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("reading %s: %w (fix the YAML, or delete the file and add the contexts again with `gpupass context set`)", path, err)
	}
	for _, x := range c.Contexts {
		if err := ValidName(x.Name); err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
	}
	return c, nil
}

// Save writes the config to c.Path: the directory 0700 and the file
// 0600, since a context may name or hold a secret.
func (c *Config) Save() error {
	if c.Path == "" {
		return errors.New("saving the gpupass config: no path")
	}
	if err := os.MkdirAll(filepath.Dir(c.Path), 0o700); err != nil {
		return fmt.Errorf("saving %s: %w", c.Path, err)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return fmt.Errorf("saving %s: %w", c.Path, err)
	}
	if err := fsutil.WriteFileAtomic(c.Path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("saving %s: %w", c.Path, err)
	}
	return nil
}

// Get returns the context called name.
func (c *Config) Get(name string) (*Context, bool) {
	i := slices.IndexFunc(c.Contexts, func(x Context) bool { return x.Name == name })
	if i < 0 {
		return nil, false
	}
	return &c.Contexts[i], true
}

// Set adds x, or replaces the context of the same name.
func (c *Config) Set(x Context) {
	if old, ok := c.Get(x.Name); ok {
		*old = x
		return
	}
	c.Contexts = append(c.Contexts, x)
}

// Remove deletes the context called name, and unsets it as current; it
// reports whether there was one.
func (c *Config) Remove(name string) bool {
	n := len(c.Contexts)
	c.Contexts = slices.DeleteFunc(c.Contexts, func(x Context) bool { return x.Name == name })
	if c.CurrentContext == name {
		c.CurrentContext = ""
	}
	return len(c.Contexts) != n
}

// Names lists the contexts' names.
func (c *Config) Names() []string {
	var names []string
	for _, x := range c.Contexts {
		names = append(names, x.Name)
	}
	return names
}

// NotFoundError is a context name the config does not have.
type NotFoundError struct {
	Name, Path string
	Names      []string
}

func (e *NotFoundError) Error() string {
	if len(e.Names) == 0 {
		return fmt.Sprintf("no context %q: %s has none; add one with `gpupass context set NAME --broker-url URL --token-file FILE`", e.Name, e.Path)
	}
	return fmt.Sprintf("no context %q in %s (there are: %s); `gpupass context ls` lists them", e.Name, e.Path, strings.Join(e.Names, ", "))
}

// Lookup returns the context called name, or a *NotFoundError.
func (c *Config) Lookup(name string) (*Context, error) {
	if x, ok := c.Get(name); ok {
		return x, nil
	}
	return nil, &NotFoundError{Name: name, Path: c.Path, Names: c.Names()}
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidName checks a context name: letters, digits, '.', '_' and '-',
// so that every command printed with it works pasted unquoted.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("context name %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// SafeName turns s (a directory's name) into a valid context name, or
// "local" when nothing of it is usable.
func SafeName(s string) string {
	b := []rune{}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			b = append(b, r)
		default:
			b = append(b, '-')
		}
	}
	name := strings.TrimLeft(string(b), "._-")
	if len(name) > 63 {
		name = name[:63]
	}
	if ValidName(name) != nil {
		return "local"
	}
	return name
}

// Abs is path made absolute against the config file's directory, the
// way a relative token-file or tls-ca in config.yaml is meant.
func (c *Config) Abs(path string) string {
	if path == "" || filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(filepath.Dir(c.Path), path)
}

// ReadToken reads the token of a context with a token file or an inline
// token. Its errors name the file and the fix.
func (c *Config) ReadToken(x *Context) (string, error) {
	if x.TokenFile == "" {
		return x.Token, nil
	}
	path := c.Abs(x.TokenFile)
	fix := fmt.Sprintf("write the broker token into it (one line, mode 0600), or point the context at the file that has it: gpupass context set %s --token-file FILE", x.Name)
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", fmt.Errorf("context %q: token file %s: %w: %s", x.Name, path, err, fix)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" || strings.ContainsAny(tok, "\n\r") {
		return "", fmt.Errorf("context %q: token file %s does not hold one token on one line: %s", x.Name, path, fix)
	}
	return tok, nil
}
