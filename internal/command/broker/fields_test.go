package broker

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestOptionErrorsNameFlags: the broker refuses a setting in its own
// terms; gpupass-broker names the flag the operator typed.
func TestOptionErrorsNameFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"token without regions", []string{"token", "create", "--role", "read"}, "--regions is required"},
		{"cert without key", []string{"serve", "--listen", "127.0.0.1:0", "--tls-cert", "cert.pem"}, "--tls-cert and --tls-key go together"},
		{"time limit cap over 30 days", []string{"serve", "--listen", "127.0.0.1:0", "--max-time-limit", "721h"}, "--max-time-limit is 721h0m0s: give 1s to 720h"},
		{"time limit cap under a second", []string{"serve", "--listen", "127.0.0.1:0", "--max-time-limit", "500ms"}, "--max-time-limit is 500ms: give 1s to 720h"},
		{"body memory below a token's share", []string{"serve", "--listen", "127.0.0.1:0", "--max-body-memory", "100MiB", "--max-body-memory-per-token", "128MiB"}, `--max-body-memory "104857600" is below the --max-body-memory-per-token`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := filepath.Join(t.TempDir(), "broker.db")
			var out, errb bytes.Buffer
			code := Main(context.Background(), append(tt.args, "--db", "sqlite://"+db), &out, &errb)
			if code == 0 || !strings.Contains(errb.String(), tt.want) {
				t.Errorf("gpupass-broker %s: exit %d, stderr %q; want %q", strings.Join(tt.args, " "), code, errb.String(), tt.want)
			}
		})
	}
	for field, name := range flagNames {
		if !strings.HasPrefix(name, "--") {
			t.Errorf("flagNames[%q] = %q, want a flag", field, name)
		}
	}
}
