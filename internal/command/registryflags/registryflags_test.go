package registryflags_test

import (
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/command/registryflags"
)

// TestFlags: the one flag set, with the agent's old --registry-plain-http
// still setting the same value (hidden), maps to the library's options.
func TestFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		args      []string
		plainHTTP bool
		user      string
		timeout   time.Duration
	}{
		{name: "defaults", timeout: 30 * time.Second},
		{name: "current name", args: []string{"--plain-http", "--registry-username", "u", "--registry-password", "p", "--registry-timeout", "5s"}, plainHTTP: true, user: "u", timeout: 5 * time.Second},
		{name: "old agent name", args: []string{"--registry-plain-http"}, plainHTTP: true, timeout: 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var r registryflags.Flags
			fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
			r.AddFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			o := r.Options("gpupass-test")
			if o.PlainHTTP != tt.plainHTTP || o.Username != tt.user || o.HeaderTimeout != tt.timeout || o.IdleTimeout != tt.timeout || o.UserAgent != "gpupass-test" || o.Retry.Steps == 0 {
				t.Errorf("%v: options %+v", tt.args, o)
			}
			if f := fs.Lookup("registry-plain-http"); f == nil || !f.Hidden || f.Deprecated == "" {
				t.Errorf("--registry-plain-http: %+v, want a hidden deprecated alias", f)
			}
		})
	}
}
