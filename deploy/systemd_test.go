// Package deploy holds deployment files (systemd units, the agent's
// environment file); its tests check them against the real binaries.
package deploy

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// unit reads a unit file with ExecStart's binary pointed at the one this
// test built (systemd-analyze verify checks it is executable).
func unit(t *testing.T, name, bin, built string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("systemd", name))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, "ExecStart=/usr/local/bin/"+bin+" ") {
		t.Fatalf("%s: ExecStart does not start /usr/local/bin/%s", name, bin)
	}
	return strings.ReplaceAll(s, "/usr/local/bin/"+bin, built)
}

// TestUnitsVerify: systemd itself reads both units without a word (an
// unknown key is only a warning to it, so any output fails the test).
func TestUnitsVerify(t *testing.T) {
	t.Parallel()
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		testutil.Missing(t, "systemd-analyze (Debian package systemd)")
	}
	for _, u := range []struct{ file, bin string }{
		{"gpupass-agent.service", "gpupass-agent"},
		{"gpupass-broker.service", "gpupass-broker"},
	} {
		t.Run(u.file, func(t *testing.T) {
			text := unit(t, u.file, u.bin, testutil.BuildBinary(t, "./cmd/"+u.bin))
			p := filepath.Join(t.TempDir(), u.file)
			if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(sa, "verify", p).CombinedOutput()
			if err != nil || len(strings.TrimSpace(string(out))) > 0 {
				t.Errorf("systemd-analyze verify %s: %v\n%s", u.file, err, out)
			}
		})
	}
}

var envLine = regexp.MustCompile(`^#?\s*(GPUPASS_[A-Z0-9_]+)=(.*)$`)

// flags lists a binary's --flags from its help.
func flags(t *testing.T, bin string, args ...string) map[string]bool {
	t.Helper()
	out, err := exec.Command(bin, append(args, "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", bin, err, out)
	}
	m := map[string]bool{}
	for _, f := range regexp.MustCompile(`--([a-z][a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		m[f[1]] = true
	}
	return m
}

// flagOf is flagenv.Name read backwards: GPUPASS_TLS_CA is
// --tls-ca; a secret's _FILE form names the secret's flag.
func flagOf(v string, have map[string]bool) (string, bool) {
	f := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(v, "GPUPASS_"), "_", "-"))
	if have[f] {
		return f, true
	}
	if base, ok := strings.CutSuffix(f, "-file"); ok && have[base] {
		return base, true
	}
	return f, false
}

// TestEnvFilesNameRealFlags: every GPUPASS_ variable the deployment files
// set or suggest (commented out) is one the binaries read, and every flag
// on ExecStart exists.
func TestEnvFilesNameRealFlags(t *testing.T) {
	t.Parallel()
	agentFlags := flags(t, testutil.BuildBinary(t, "./cmd/gpupass-agent"))
	brokerFlags := flags(t, testutil.BuildBinary(t, "./cmd/gpupass-broker"), "serve")
	for _, c := range []struct {
		file string
		have map[string]bool
	}{
		{"agent.env", agentFlags},
		{"gpupass-agent.service", agentFlags},
		{"gpupass-broker.service", brokerFlags},
	} {
		f, err := os.Open(filepath.Join("systemd", c.file))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		n := 0
		for sc.Scan() {
			line := strings.TrimPrefix(strings.TrimSpace(sc.Text()), "Environment=")
			if m := envLine.FindStringSubmatch(line); m != nil {
				n++
				if fl, ok := flagOf(m[1], c.have); !ok {
					t.Errorf("%s: %s sets --%s, which the binary does not have", c.file, m[1], fl)
				}
			}
			if rest, ok := strings.CutPrefix(line, "ExecStart="); ok {
				for _, fl := range regexp.MustCompile(`--([a-z][a-z0-9-]+)`).FindAllStringSubmatch(rest, -1) {
					if !c.have[fl[1]] {
						t.Errorf("%s: ExecStart passes --%s, which the binary does not have", c.file, fl[1])
					}
				}
			}
		}
		f.Close()
		if n == 0 && c.file == "agent.env" {
			t.Errorf("%s sets no GPUPASS_ variable", c.file)
		}
	}
}

// TestAgentAsTheUnitStartsIt runs the agent with the unit's command line
// and agent.env's settings: everything parses and validates, and the one
// thing the install steps add, the jobs' user, is what it asks for (or,
// where that user exists, what it runs jobs as).
func TestAgentAsTheUnitStartsIt(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass-agent")
	text := unit(t, "gpupass-agent.service", "gpupass-agent", bin)
	var args []string
	for l := range strings.Lines(text) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "ExecStart="); ok {
			args = strings.Fields(rest)
		}
	}
	state := filepath.Join(t.TempDir(), "state")
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "${STATE_DIRECTORY}", state)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "STATE_DIRECTORY=" + state}
	b, err := os.ReadFile(filepath.Join("systemd", "agent.env"))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			env = append(env, l)
		}
	}
	token := filepath.Join(t.TempDir(), "agent-token")
	if err := os.WriteFile(token, []byte("gpa_not_a_real_token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The broker is a loopback port nobody listens on: this test stops
	// before enrollment either way.
	env = append(env, "GPUPASS_BROKER_TOKEN_FILE="+token, "GPUPASS_BROKER_URL=http://127.0.0.1:1", "GPUPASS_QUERY_ADDR=127.0.0.1:0", "GPUPASS_READ_PROBE_MB=1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = env
	if _, err := user.Lookup("gpupass-job"); err != nil {
		out, err := cmd.CombinedOutput()
		want := `--run-as "gpupass-job": no such user`
		if err == nil || !strings.Contains(string(out), want) || strings.Count(strings.TrimSpace(string(out)), "\n") > 0 {
			t.Fatalf("agent as the unit starts it: %v\n%s\nwant only the error %q", err, out, want)
		}
		return
	}
	out, _ := cmd.CombinedOutput() // runs until the deadline: no broker
	if !strings.Contains(string(out), `jobs run as gpupass-job (uid`) {
		t.Errorf("agent as the unit starts it:\n%s", out)
	}
}

// TestBrokerUnitKeepsStoreOwnerOnly (issue #31): the broker unit makes
// its state directory the broker user's alone and every file the broker
// creates (broker.db, -wal, -shm) unreadable by other local users.
func TestBrokerUnitKeepsStoreOwnerOnly(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("systemd", "gpupass-broker.service"))
	if err != nil {
		t.Fatal(err)
	}
	service := map[string]string{}
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && section == "[Service]" && !strings.HasPrefix(line, "#") {
			service[k] = v
		}
	}
	for k, want := range map[string]string{"UMask": "0077", "StateDirectoryMode": "0700", "StateDirectory": "gpupass-broker"} {
		if service[k] != want {
			t.Errorf("gpupass-broker.service [Service] %s=%q, want %q", k, service[k], want)
		}
	}
	if db := service["Environment"]; !strings.Contains(db, "/var/lib/gpupass-broker/") {
		t.Errorf("gpupass-broker.service keeps the store at %q, not in its StateDirectory", db)
	}
}
