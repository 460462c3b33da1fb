package gpupass_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/workdir"
)

// ciEnv is the environment of a GitHub or GitLab job whose files live in dir.
func ciEnv(kind, dir string) map[string]string {
	if kind == "github" {
		return map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": filepath.Join(dir, "output"),
			"GITHUB_STEP_SUMMARY": filepath.Join(dir, "summary"), "GITHUB_SHA": "8a3f9b21c0ffee00"}
	}
	return map[string]string{"GITLAB_CI": "true", "GPUPASS_DOTENV": filepath.Join(dir, "gpupass.env"), "CI_COMMIT_SHORT_SHA": "1234abcd"}
}

// closedURL is a loopback URL nothing listens on: a broker that is down.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// trainInputs are the train step's inputs (the action's names).
type trainInputs struct{ BrokerURL, BrokerToken, Regions, Name, TrainCommand, TimeLimit string }

// TestCIStepTrain runs the train step as the action and the component
// do (gpupass -o github|gitlab train --follow, the inputs its flags)
// against a real broker with agents
// that work the runs over the real protocol: the allocation ids reach the
// step outputs (GitHub) or the dotenv file per region (GitLab), the run
// names carry the region and the short commit, and each bad input ends
// in one clear error without the token.
func TestCIStepTrain(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	agentTok := b.Token(t, store.RoleAgent, "*")
	fakeAgent(t, b.URL, agentTok, brokertest.H100("us-west-2", 20), false)
	fakeAgent(t, b.URL, agentTok, brokertest.H100("eu-central-1", 22), true)
	fakeAgent(t, b.URL, agentTok, brokertest.H100("ap-south-1", 21), false)
	apTok := b.Token(t, store.RoleSubmit, "ap*")
	usTok := b.Token(t, store.RoleSubmit, "us-*")
	euTok := b.Token(t, store.RoleSubmit, "eu-*")
	readTok := b.Token(t, store.RoleRead, "*")
	spec := writeH100Spec(t)
	down := closedURL(t)

	tests := []struct {
		name     string
		kind     string
		opts     trainInputs
		wantCode int
		wantErr  string
		// wantFile: file in the job dir -> substrings.
		wantFile map[string][]string
		// wantIDs: the regions of the allocation-ids output.
		wantIDs []string
	}{
		{name: "GitHub: allocation ids and summary", kind: "github",
			opts:     trainInputs{BrokerURL: b.URL, BrokerToken: usTok, Regions: "us-west-2", TrainCommand: "python3 train.py --steps 5"},
			wantFile: map[string][]string{"output": {"allocation-ids<<"}, "summary": {"### gpupass train", "| us-west-2 | `alloc-", "llm-finetune-8a3f9b2-us-west-2", "succeeded"}},
			wantIDs:  []string{"us-west-2"}},
		{name: "GitLab: one dotenv variable per region", kind: "gitlab",
			opts:     trainInputs{BrokerURL: b.URL, BrokerToken: usTok, Regions: "us-west-2", Name: "bert", TrainCommand: `["python3","train.py"]`},
			wantFile: map[string][]string{"gpupass.env": {`GPUPASS_ALLOCATION_IDS={"us-west-2":"alloc-`, "GPUPASS_ALLOCATION_US_WEST_2=alloc-"}},
			wantIDs:  []string{"us-west-2"}},
		{name: "a failed run fails the step and still hands off its id", kind: "gitlab",
			opts:     trainInputs{BrokerURL: b.URL, BrokerToken: euTok, Regions: "eu-central-1", TrainCommand: "python3 train.py"},
			wantCode: gpupass.ExitFindings, wantErr: "1 of 1 runs did not succeed",
			wantFile: map[string][]string{"gpupass.env": {"GPUPASS_ALLOCATION_EU_CENTRAL_1=alloc-"}},
			wantIDs:  []string{"eu-central-1"}},
		{name: "a region name the output name changes", kind: "gitlab",
			opts:     trainInputs{BrokerURL: b.URL, BrokerToken: apTok, Regions: "ap-south-1", TrainCommand: "python3 train.py"},
			wantFile: map[string][]string{"gpupass.env": {`GPUPASS_ALLOCATION_IDS={"ap-south-1":"alloc-`, "GPUPASS_ALLOCATION_AP_SOUTH_1=alloc-"}},
			wantIDs:  []string{"ap-south-1"}},
		// Issue #32, item 5: one rule for region names, before the broker
		// is asked (it refuses them too).
		{name: "a region name that is none", kind: "gitlab",
			opts:     trainInputs{BrokerURL: b.URL, BrokerToken: apTok, Regions: "ap_south.1", TrainCommand: "python3 train.py"},
			wantCode: gpupass.ExitUsage, wantErr: `"ap_south.1": not a region name: use lowercase letters, digits and '-'`},
		{name: "token scoped to another region", kind: "github",
			opts:     trainInputs{BrokerURL: b.URL, BrokerToken: usTok, Regions: "eu-central-1", TrainCommand: "python3 train.py"},
			wantCode: gpupass.ExitUsage, wantErr: "submitting the run in eu-central-1"},
		{name: "token without the submit role", kind: "github",
			opts:     trainInputs{BrokerURL: b.URL, BrokerToken: readTok, Regions: "us-west-2", TrainCommand: "python3 train.py"},
			wantCode: gpupass.ExitUsage, wantErr: "role"},
		{name: "broker down", kind: "gitlab",
			opts:     trainInputs{BrokerURL: down, BrokerToken: usTok, Regions: "us-west-2", TrainCommand: "python3 train.py"},
			wantCode: gpupass.ExitUsage, wantErr: "submitting the run in us-west-2 at " + down},
		{name: "missing inputs are named at once", kind: "github",
			opts:     trainInputs{BrokerToken: usTok},
			wantCode: gpupass.ExitUsage, wantErr: "train: missing --broker-url (GPUPASS_BROKER_URL, the broker-url input), --region (GPUPASS_REGION, the regions input), --command (GPUPASS_COMMAND, the train-command input)"},
		{name: "unbalanced quote in the command", kind: "github",
			opts:     trainInputs{BrokerURL: b.URL, BrokerToken: usTok, Regions: "us-west-2", TrainCommand: `python3 "train.py`},
			wantCode: gpupass.ExitUsage, wantErr: "--command (GPUPASS_COMMAND, the train-command input): unterminated \" quote"},
		{name: "time limit that is no duration", kind: "gitlab",
			opts:     trainInputs{BrokerURL: b.URL, BrokerToken: usTok, Regions: "us-west-2", TrainCommand: "python3 train.py", TimeLimit: "ninety minutes"},
			wantCode: gpupass.ExitUsage, wantErr: "--time-limit (GPUPASS_TIME_LIMIT, the time-limit input)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			env := ciEnv(tt.kind, dir)
			in := tt.opts
			o := &gpupass.TrainOptions{Global: &gpupass.GlobalOptions{Output: output.Format(tt.kind)}, Follow: true, CommandLine: in.TrainCommand,
				Broker: gpupass.BrokerFlags{URL: in.BrokerURL, Token: in.BrokerToken},
				Options: apptrain.Options{Spec: spec, Regions: []string{in.Regions}, Name: in.Name, TimeLimit: in.TimeLimit, NoWorkdir: true,
					MaxRestarts: 3, MinHealthScore: api.DefaultMinHealthScore, WorkdirLimits: workdir.Default(), Getenv: func(k string) string { return env[k] }}}
			var out, log bytes.Buffer
			o.Broker.ErrOut = &log
			err := gpupass.RunTrain(context.Background(), o, &out, &log)
			if got := gpupass.ExitCode(err); got != tt.wantCode {
				t.Fatalf("exit code %d (err %v), want %d\nstdout:\n%s\nlog:\n%s", got, err, tt.wantCode, out.String(), log.String())
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("error %v, want it to say %q", err, tt.wantErr)
			}
			testutil.WantFiles(t, dir, tt.wantFile)
			if tt.wantIDs != nil {
				ids := allocationIDs(t, tt.kind, dir)
				var regions []string
				for r, id := range ids {
					regions = append(regions, r)
					if !allocRE.MatchString(id) {
						t.Errorf("allocation id of %s = %q", r, id)
					}
				}
				if diff := cmp.Diff(tt.wantIDs, regions); diff != "" {
					t.Errorf("regions of allocation-ids (-want +got):\n%s", diff)
				}
			}
			all := out.String() + log.String()
			if err != nil {
				all += err.Error()
			}
			for _, secret := range []string{usTok, euTok, readTok, apTok} {
				if strings.Contains(all, secret) {
					t.Errorf("a token reached the output:\n%s", all)
				}
			}
			if strings.Contains(all, "goroutine ") {
				t.Errorf("a stack trace reached the output:\n%s", all)
			}
		})
	}
}

// allocationIDs reads the allocation-ids output back as the next job does.
func allocationIDs(t *testing.T, kind, dir string) map[string]string {
	t.Helper()
	var raw string
	if kind == "github" {
		b, _ := os.ReadFile(filepath.Join(dir, "output"))
		// name<<DELIM\nvalue\nDELIM
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, "allocation-ids<<") && i+1 < len(lines) {
				raw = lines[i+1]
			}
		}
	} else {
		b, _ := os.ReadFile(filepath.Join(dir, "gpupass.env"))
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "GPUPASS_ALLOCATION_IDS="); ok {
				raw = v
			}
		}
	}
	ids := map[string]string{}
	if err := json.Unmarshal([]byte(raw), &ids); err != nil {
		t.Fatalf("allocation-ids %q: %v", raw, err)
	}
	return ids
}
