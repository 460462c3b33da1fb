// Package registryflags is the one set of wheel-bundle registry flags
// that gpupass and gpupass-agent both register, so a setting has one flag
// name (and one GPUPASS_* variable) whichever binary it is given to. It
// sits below the command layer, which may not import across binaries;
// what the values mean lives in package bundle.
package registryflags

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/command/flagenv"
)

// Flags say how a wheel-bundle registry is reached: the CLI pushes and
// pulls through it (gpupass bundle push/pull), the agent pulls a run's
// bundle. Without a user name, credentials come from the docker config
// (~/.docker/config.json of the user, $DOCKER_CONFIG, credential helpers).
type Flags struct {
	PlainHTTP bool
	Username  string
	Password  string
	// Timeout bounds the wait for a registry's response headers and
	// each pause in its bytes on a pull.
	Timeout time.Duration
}

// Marked once: roots are built concurrently in tests, and MarkSecret
// writes a plain map. The password's GPUPASS_REGISTRY_PASSWORD_FILE works
// because of it.
func init() { flagenv.MarkSecret("registry-password") }

// AddFlags registers the registry flags, the same for every binary.
func (r *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&r.PlainHTTP, "plain-http", false, "talk plain HTTP to the registry (loopback test registries only; TLS otherwise)")
	// The agent's name of before; GPUPASS_REGISTRY_PLAIN_HTTP in agent
	// units and `gpupass up` environments keeps working, with a note.
	flagenv.Alias(fs, "plain-http", "registry-plain-http")
	fs.StringVar(&r.Username, "registry-username", "", "registry user name (default: docker config credentials)")
	fs.StringVar(&r.Password, "registry-password", "", "registry password or token (secret; prefer GPUPASS_REGISTRY_PASSWORD_FILE)")
	fs.DurationVar(&r.Timeout, "registry-timeout", bundle.DefaultTimeout, "longest wait of a pull for the registry's response headers or for the next bytes of a response")
}

// Options are the library's registry options; userAgent names the
// binary to the registry. Options.Validate checks the credentials.
func (r *Flags) Options(userAgent string) bundle.RegistryOptions {
	return bundle.RegistryOptions{
		PlainHTTP: r.PlainHTTP, Username: r.Username, Password: r.Password,
		Retry: bundle.DefaultRetry, UserAgent: userAgent,
		HeaderTimeout: r.Timeout, IdleTimeout: r.Timeout,
	}
}
