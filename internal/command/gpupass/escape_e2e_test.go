//go:build e2e

package gpupass_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// hostileOutput prints what a job could use to take over the terminal of
// whoever follows its log: clear screen (CSI 2J), an OSC 8 hyperlink, a
// C1 control (U+0085, NEL), a bidi override (U+202E) and a bidi isolate
// (U+2066), and a bell.
const hostileOutput = `printf 'clear \033[2J link \033]8;;http://evil.example/\033\\click\033]8;;\033\\ c1 \302\205 bidi \342\200\256evil\342\201\246 bell \007 end\n'`

// rawControl finds bytes and characters a terminal would act on.
var rawControl = regexp.MustCompile("[\x00-\x09\x0b-\x1f\x7f\u0080-\u009f\u202a-\u202e\u2066-\u2069]")

func checkNoControl(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s printed invalid UTF-8: %q", what, out)
	}
	if loc := rawControl.FindStringIndex(out); loc != nil {
		t.Errorf("%s printed a raw control character %q at byte %d:\n%q", what, out[loc[0]:loc[1]], loc[0], out)
	}
}

// TestEscapesReachNoTerminal: a run's output with escape sequences is
// shown escaped by `train --follow`, `logs --follow` and `runs` of the
// real binary against a real broker and agent, and a run name with them
// is refused by the CLI and by the broker (issue #16, finding 10).
func TestEscapesReachNoTerminal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	output := func(args ...string) (string, error) {
		b, err := stack.Command(ctx, args...).CombinedOutput()
		return string(b), err
	}

	out, err := output("train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--name", "esc",
		"--follow", "--", "sh", "-c", hostileOutput)
	if err != nil {
		t.Fatalf("train --follow: %v\n%q", err, out)
	}
	checkNoControl(t, "train --follow", out)
	for _, want := range []string{`clear \x1b[2J`, `\x1b]8;;http://evil.example/\x1b\click`, `c1 \u0085`, `bidi \u202eevil\u2066`, `bell \x07 end`} {
		if !strings.Contains(out, want) {
			t.Errorf("train --follow does not show %q:\n%s", want, out)
		}
	}
	id := regexp.MustCompile(`alloc-[0-9a-f]+`).FindString(out)
	if id == "" {
		t.Fatalf("no allocation id in:\n%s", out)
	}
	out, err = output("logs", "--follow", id)
	if err != nil {
		t.Fatalf("logs --follow %s: %v\n%q", id, err, out)
	}
	checkNoControl(t, "logs --follow", out)
	if !strings.Contains(out, `clear \x1b[2J`) {
		t.Errorf("logs --follow does not show the escaped line:\n%s", out)
	}
	out, err = output("runs")
	if err != nil {
		t.Fatalf("runs: %v\n%q", err, out)
	}
	checkNoControl(t, "runs", out)

	// Names: the CLI refuses before sending, the broker for any client.
	out, err = output("train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--name", "x\x1b[2J\u202e", "--", "true")
	if err == nil || !strings.Contains(out, "--name") || !strings.Contains(out, "letters, digits") {
		t.Errorf("train --name with escapes: %v\n%s", err, out)
	}
	checkNoControl(t, "train --name refusal", out)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(filepath.Join(stack.Root, "examples", "train", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []*gpupassv1.SubmitRequest{
		{Name: "x\x1b]8;;http://evil/\x1b\\", Region: "us-west-2", Command: []string{"true"}},
		{Name: "ok\u202eevil", Region: "us-west-2", Command: []string{"true"}},
		{Name: "n\u0085el", Region: "us-west-2", Command: []string{"true"}},
	} {
		req.SpecYaml = spec
		_, err := rc.Run.Submit(ctx, connect.NewRequest(req))
		// The broker names its request field (a server does not know the
		// client's flags; gpupass train renames it to --name).
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "name: run name") || strings.Contains(err.Error(), "--name") {
			t.Errorf("Submit with name %q: %v; want invalid_argument naming the field name", req.Name, err)
		}
	}
}
