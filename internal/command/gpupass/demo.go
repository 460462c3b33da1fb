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
	"github.com/gpupass/gpupass/internal/app/runlog"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
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

// runClients dials the stack's run services. Like up's agents, the demo
// is the stack's own: a broker up put off loopback (--listen 10.0.0.5:0)
// has its consent to plain HTTP.
func runClients(cfg *LocalConfig) (*client.RunClients, error) {
	return client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token, InsecureHTTP: stackOffLoopback(cfg), UserAgent: buildinfo.UserAgent("gpupass")})
}

// demoEnv is the environment of the gpupass commands the demo runs: the
// stack's broker, and the consent runClients gives.
func demoEnv(cfg *LocalConfig) []string {
	env := append(os.Environ(), "GPUPASS_STATE_DIR="+cfg.StateDir, "GPUPASS_BROKER_URL="+cfg.BrokerURL, "GPUPASS_BROKER_TOKEN="+cfg.Token)
	if stackOffLoopback(cfg) {
		env = append(env, EnvName("insecure-http")+"=true")
	}
	return env
}

func stackOffLoopback(cfg *LocalConfig) bool { return client.PlainHTTPOffHost(cfg.BrokerURL) != "" }

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
	// As gpupass train sends it: the canonical JSON is the spec, the file
	// as written goes beside it for the audit.
	_, specJSON, err := spec.EncodeFile(specPath, specYAML)
	if err != nil {
		return fmt.Errorf("%s: %w", specPath, err)
	}
	demoDir := filepath.Join(cfg.StateDir, "demo")
	if err := os.MkdirAll(demoDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", demoDir, err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the gpupass binary: %w", err)
	}
	env := demoEnv(cfg)
	sub := func(args ...string) error {
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, out, out
		return cmd.Run()
	}
	// saveLog writes a run's whole log to a file: the stack, and with it
	// `gpupass logs`, is gone when the demo ends.
	saveLog := func(id, path string) error {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, self, "logs", id)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, f, out
		err = cmd.Run()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}

	fmt.Fprintf(out, "\n== 1/4 validate %s\n", specPath)
	if err := sub("validate", "--spec", specPath, "--dry-run", "--region", strings.Join(regions, ",")); err != nil {
		return fmt.Errorf("validate %s: %w", specPath, err)
	}

	// The demo shows the NaN guard for real: train.py makes the loss NaN
	// once, halfway, on a fresh start; gpupass restarts the job from the
	// checkpoint saved before it, and the resumed run goes on to the end.
	every := max(1, o.Steps/4)
	nanAt := 2*every + 1
	inject := []string{"--checkpoint-every", fmt.Sprint(every)}
	if o.Steps >= 3 {
		inject = append(inject, "--nan-at-step", fmt.Sprint(nanAt))
		fmt.Fprintf(out, "\n== 2/4 train in %s with the real PyTorch example (%d steps, a NaN injected at step %d and recovered from a checkpoint)\n", strings.Join(regions, " and "), o.Steps, nanAt)
	} else {
		fmt.Fprintf(out, "\n== 2/4 train in %s with the real PyTorch example (%d steps)\n", strings.Join(regions, " and "), o.Steps)
	}
	archive, err := archiveDir(o.ExampleDir, workdir.Default())
	if err != nil {
		return err
	}
	rcs, err := runClients(cfg)
	if err != nil {
		return err
	}
	rc := rcs.Run
	python := o.Python
	if python == "" {
		python = probe.DefaultPython
	}
	var runs []*gpupassv1.Run
	for _, r := range regions {
		resp, err := rc.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
			SpecYaml: specYAML, SpecJson: specJSON, Region: r, Name: "demo",
			Command:        append([]string{python, "train.py", "--steps", fmt.Sprint(o.Steps)}, inject...),
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
		wg     sync.WaitGroup
		finals = make([]*gpupassv1.Run, len(runs))
		errs   = make([]error, len(runs))
		// The same lines, in the same form, as `train --follow`.
		p = &runlog.Printer{Out: out, Prefix: true}
	)
	for i, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			finals[i], errs[i] = runlog.Follow(ctx, rcs, run, 0, true, false, p, log)
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
		if err := saveLog(run.Id, filepath.Join(demoDir, run.Id+".log")); err != nil {
			return fmt.Errorf("saving the log of %s: %w", run.Id, err)
		}
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
		fmt.Fprintf(out, "  run      %s  %s  log %s\n", f.Id, f.Region, filepath.Join(demoDir, f.Id+".log"))
	}
	fmt.Fprintf(out, "  metrics  %s\n  report   %s (chart %s)\n", strings.Join(files, ", "), md, svg)
	fmt.Fprintf(out, "  audit    %s (verify: gpupass audit verify %s --key %s.pub --agent-key %s)\n", zip, zip, keyPrefix, agentPub)
	fmt.Fprintf(out, "  nodes are simulated (\"simulated\": true): the training is real, the GPUs are not\n")
	log.Debug("demo finished")
	return nil
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
