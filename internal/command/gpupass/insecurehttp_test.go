package gpupass

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/api"
)

// The plain HTTP consent (--insecure-http) reaches a broker the CLI found
// itself, not only one given by --broker-url: here the stack config of a
// `gpupass up --listen ADDR` off loopback (a context is filled the same
// way). Without it the dial is refused, naming the consent; with it the
// command's stderr hears the warning once, however many clients the
// command dials (train dials two). Nothing connects: an address literal
// is refused or let through at Dial.
func TestInsecureHTTPReachesFoundBroker(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const url = "http://198.18.0.2:7070"
	if _, err := writeLocalConfig(dir, &LocalConfig{BrokerURL: url, Token: "gpp_stack", StateDir: dir}); err != nil {
		t.Fatal(err)
	}
	getenv := func(k string) string { return map[string]string{"GPUPASS_STATE_DIR": dir, "HOME": dir}[k] }
	for _, consent := range []bool{false, true} {
		var stderr bytes.Buffer
		cmd := &cobra.Command{Use: "runs"}
		cmd.SetErr(&stderr)
		b := &BrokerFlags{getenv: getenv}
		b.AddFlags(cmd)
		b.InsecureHTTP = consent
		_, err := b.Dial()
		_, errRuns := b.DialRuns()
		if b.URL != url {
			t.Fatalf("broker %q, want the stack's %s", b.URL, url)
		}
		warnings := strings.Count(stderr.String(), "the broker token goes over plain HTTP, unencrypted, to "+url+" (--insecure-http)")
		if !consent {
			for _, err := range []error{err, errRuns} {
				if p, ok := api.PlainHTTP(err); !ok || p.Host != "198.18.0.2" {
					t.Errorf("without --insecure-http: %v, want the plain HTTP refusal", err)
				}
			}
			if warnings != 0 {
				t.Errorf("without --insecure-http, a warning:\n%s", stderr.String())
			}
			continue
		}
		if err != nil || errRuns != nil {
			t.Errorf("with --insecure-http: %v, %v", err, errRuns)
		}
		if warnings != 1 {
			t.Errorf("with --insecure-http, %d warnings on the command's stderr, want 1:\n%s", warnings, stderr.String())
		}
	}
}

// `up --demo` with its broker off loopback: the demo's own dial and the
// gpupass commands it runs have the consent up's agents have (they were
// refused: the demo stopped at its first step); on loopback none is
// given, since none is needed.
func TestDemoConsentsOffLoopback(t *testing.T) {
	t.Parallel()
	for url, off := range map[string]bool{"http://198.18.0.2:7070": true, "http://127.0.0.1:7070": false} {
		cfg := &LocalConfig{BrokerURL: url, Token: "gpp_stack", StateDir: t.TempDir()}
		if _, err := runClients(cfg); err != nil {
			t.Errorf("%s: the demo's dial: %v", url, err)
		}
		if got := slices.Contains(demoEnv(cfg), "GPUPASS_INSECURE_HTTP=true"); got != off {
			t.Errorf("%s: GPUPASS_INSECURE_HTTP=true in the demo's commands' environment: %v, want %v", url, got, off)
		}
	}
}
