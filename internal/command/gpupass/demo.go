package gpupass

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/workdir"
)

// DemoOptions tune `gpupass up --demo`.
type DemoOptions struct {
	ExampleDir string
	Steps      int
	Python     string
}

// AddFlags registers the demo's flags.
func (o *DemoOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.ExampleDir, "example", "examples/train", "example project the demo trains (gpupass.yaml + train.py)")
	f.IntVar(&o.Steps, "demo-steps", 100, "training steps per region in the demo")
}

// runClient dials the broker's RunService.
func runClient(url, token string) (gpupassv1connect.RunServiceClient, error) {
	c, err := client.DialRuns(url, client.Options{Token: token, UserAgent: buildinfo.UserAgent("gpupass")})
	if err != nil {
		return nil, err
	}
	return c.Run, nil
}

// RunDemo runs the example pipeline on a started stack: validate, train in
// the first two regions with the real PyTorch example, fetch metrics,
// compare and audit, printing where each result is.
func RunDemo(ctx context.Context, o *DemoOptions, cfg *LocalConfig, out io.Writer, log *slog.Logger) error {
	if len(cfg.Regions) < 2 {
		return errors.New("--demo trains in two regions: give two --region values")
	}
	regions := cfg.Regions[:2]
	specPath := filepath.Join(o.ExampleDir, "gpupass.yaml")
	specYAML, err := os.ReadFile(specPath)
	if err != nil {
		return fmt.Errorf("reading the example spec: %w (run from the repository root, or pass --example DIR)", err)
	}
	demoDir := filepath.Join(cfg.StateDir, "demo")
	if err := os.MkdirAll(demoDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", demoDir, err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the gpupass binary: %w", err)
	}
	env := append(os.Environ(), "GPUPASS_STATE_DIR="+cfg.StateDir, "GPUPASS_BROKER_URL="+cfg.BrokerURL, "GPUPASS_BROKER_TOKEN="+cfg.Token)
	sub := func(args ...string) error {
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, out, out
		return cmd.Run()
	}

	fmt.Fprintf(out, "\n== 1/4 validate %s\n", specPath)
	if err := sub("validate", "--spec", specPath, "--dry-run", "--region", strings.Join(regions, ",")); err != nil {
		return fmt.Errorf("validate %s: %w", specPath, err)
	}

	fmt.Fprintf(out, "\n== 2/4 train in %s with the real PyTorch example (%d steps)\n", strings.Join(regions, " and "), o.Steps)
	archive, err := archiveDir(o.ExampleDir, workdir.Default())
	if err != nil {
		return err
	}
	rc, err := runClient(cfg.BrokerURL, cfg.Token)
	if err != nil {
		return err
	}
	python := o.Python
	if python == "" {
		python = "/usr/bin/python3"
	}
	var runs []*gpupassv1.Run
	for _, r := range regions {
		resp, err := rc.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
			Spec: &gpupassv1.SubmitRequest_SpecYaml{SpecYaml: specYAML}, Region: r, Name: "demo",
			Command:        []string{python, "train.py", "--steps", fmt.Sprint(o.Steps)},
			WorkdirArchive: archive,
		}))
		if err != nil {
			return rpcError("submitting the demo run in "+r, cfg.BrokerURL, err)
		}
		run := resp.Msg.Run
		fmt.Fprintf(out, "%-14s %s on %s (score %s)\n", r, run.Id, run.NodeId, f2(run.GetScore().GetScore()))
		runs = append(runs, run)
	}
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		finals = make([]*gpupassv1.Run, len(runs))
		errs   = make([]error, len(runs))
	)
	for i, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			finals[i], errs[i] = demoFollow(ctx, rc, run, func(line string) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(out, "%-14s %s\n", run.Region, line)
			})
		}()
	}
	wg.Wait()
	ok := true
	for i, f := range finals {
		if errs[i] != nil {
			return fmt.Errorf("following %s: %w", runs[i].Id, errs[i])
		}
		fmt.Fprintf(out, "%-14s %s %s %s\n", f.Region, f.Id, strings.ToLower(strings.TrimPrefix(f.State.String(), "ALLOC_STATE_")), f.Reason)
		ok = ok && f.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED
	}
	if !ok {
		return Findings(errors.New("a demo run did not succeed; see its log above"))
	}

	fmt.Fprintf(out, "\n== 3/4 compare %s %s\n", runs[0].Id, runs[1].Id)
	var files []string
	for _, run := range runs {
		p := filepath.Join(demoDir, run.Id+"-metrics.jsonl")
		n, err := writeMetricsFile(ctx, rc, run.Id, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "metrics of %s: %d points via the API -> %s\n", run.Id, n, p)
		files = append(files, p)
	}
	md, svg := filepath.Join(demoDir, "compare.md"), filepath.Join(demoDir, "compare.svg")
	args := []string{"compare", "--post", "none", "--markdown", md, "--svg", svg}
	for _, run := range runs {
		// By allocation id: compare reads the series from the broker.
		args = append(args, "--label", run.Region+"="+run.Id)
	}
	if err := sub(args...); err != nil {
		return fmt.Errorf("compare: %w", err)
	}

	fmt.Fprintf(out, "\n== 4/4 audit %s\n", runs[0].Id)
	// A demo key pair: the password only protects it on this disk.
	env = append(env, "COSIGN_PASSWORD=gpupass-demo")
	keyPrefix := filepath.Join(demoDir, "cosign")
	if _, err := os.Stat(keyPrefix + ".key"); err != nil {
		if err := sub("audit", "keygen", "--out-prefix", keyPrefix); err != nil {
			return fmt.Errorf("audit keygen: %w", err)
		}
	}
	// The audit reads the run from the broker alone, as an auditor with
	// a read token would; so does the agent key the verify step pins.
	zip := filepath.Join(demoDir, "audit-"+runs[0].Id+".zip")
	if err := sub("audit", runs[0].Id, "--key", keyPrefix+".key", "--out", zip); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	agentPub, err := demoAgentKey(ctx, rc, cfg, runs[0].Id, demoDir)
	if err != nil {
		return err
	}
	if err := sub("audit", "verify", zip, "--key", keyPrefix+".pub", "--agent-key", agentPub); err != nil {
		return fmt.Errorf("audit verify: %w", err)
	}

	fmt.Fprintf(out, "\nresults:\n")
	for _, f := range finals {
		fmt.Fprintf(out, "  run      %s  %s  gpupass logs %s\n", f.Id, f.Region, f.Id)
	}
	fmt.Fprintf(out, "  metrics  %s\n  report   %s (chart %s)\n", strings.Join(files, ", "), md, svg)
	fmt.Fprintf(out, "  audit    %s (verify: gpupass audit verify %s --key %s.pub --agent-key %s)\n", zip, zip, keyPrefix, agentPub)
	fmt.Fprintf(out, "  nodes are simulated (\"simulated\": true): the training is real, the GPUs are not\n")
	log.Debug("demo finished")
	return nil
}

// demoFollow streams a run's events as text lines until it is terminal.
func demoFollow(ctx context.Context, rc gpupassv1connect.RunServiceClient, run *gpupassv1.Run, line func(string)) (*gpupassv1.Run, error) {
	var after uint64
	for {
		st, err := rc.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, AfterSeq: after, Follow: true}))
		if err != nil {
			return nil, err
		}
		for st.Receive() {
			m := st.Msg()
			for _, r := range m.Records {
				after = max(after, r.Seq)
				if r.Kind != gpupassv1.RecordKind_RECORD_KIND_EVENT {
					continue
				}
				var ev events.Event
				if err := json.Unmarshal(r.Data, &ev); err != nil {
					line(fmt.Sprintf("(record %d unreadable: %v)", r.Seq, err))
					continue
				}
				line(ev.Text())
			}
			if m.Run != nil {
				st.Close()
				return m.Run, nil
			}
		}
		err = st.Err()
		st.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
			return nil, err
		}
		// The stream ended without the final run (the broker restarted):
		// follow again from where it stopped.
		time.Sleep(200 * time.Millisecond)
	}
}

// writeMetricsFile fetches a run's metric series through the API and
// writes it as JSON lines that compare reads.
func writeMetricsFile(ctx context.Context, rc gpupassv1connect.RunServiceClient, allocID, path string) (int, error) {
	resp, err := rc.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: allocID}))
	if err != nil {
		return 0, fmt.Errorf("metrics of %s: %s", allocID, api.Describe(err))
	}
	var b bytes.Buffer
	for _, p := range resp.Msg.Points {
		rec := map[string]any{"step": p.Step, "ts": time.Unix(0, p.TimeUnixNano).UTC().Format(time.RFC3339Nano)}
		keys := make([]string, 0, len(p.Values))
		for k := range p.Values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			rec[k] = p.Values[k]
		}
		line, err := json.Marshal(rec)
		if err != nil {
			return 0, fmt.Errorf("metrics of %s: %w", allocID, err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return 0, fmt.Errorf("writing %s: %w", path, err)
	}
	return len(resp.Msg.Points), nil
}

// demoAgentKey writes the public key the broker verified a run's report
// against (the node's enrolled key) for `audit verify --agent-key`.
func demoAgentKey(ctx context.Context, rc gpupassv1connect.RunServiceClient, cfg *LocalConfig, allocID, dir string) (string, error) {
	resp, err := rc.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: allocID}))
	if err != nil {
		return "", rpcError("reading the evidence of "+allocID, cfg.BrokerURL, err)
	}
	path := filepath.Join(dir, "agent-"+resp.Msg.GetRun().GetNodeId()+".pub")
	if err := os.WriteFile(path, resp.Msg.AgentPublicKeyPem, 0o644); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return path, nil
}
