package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/gpupass/gpupass/internal/command/output"
)

// The train and audit steps' --model-ref (issue #37): once the run has
// ended (train --follow) or its audit is written, the step pushes the
// run's model with its signed provenance, as `gpupass model push RUN
// REF [--audit ZIP]` does, signed as audit signs (--key / GPUPASS_KEY,
// else the job's OIDC identity). The proof was asked for: a push that
// fails fails the step.

// modelRefUsage is --model-ref's help on train and audit.
const modelRefUsage = "once done, push the run's model to this REGISTRY/REPOSITORY:TAG with its signed provenance, as gpupass model push RUN REF does (signed with GPUPASS_KEY, else the job's OIDC identity; registry login from GPUPASS_REGISTRY_USERNAME/PASSWORD or the docker config); a failed push fails the command"

// ModelPush is what --model-ref pushes: the run, where to, the audit zip
// the attestation names (audit's), and the broker the command used.
type ModelPush struct {
	AllocationID string
	Ref          string
	Audit        string
	Broker       BrokerFlags
	// Sign are the signing flags the command was given (audit's --key,
	// --signing-config…), so the model is signed as its audit was.
	Sign [][2]string
}

// checkModelRef refuses --model-ref where its output could not be read:
// -o json prints one document, the command's own.
func checkModelRef(g *GlobalOptions, ref string) error {
	if ref != "" && g.format() == output.JSON {
		return &ExitError{Code: ExitUsage, Err: errors.New("--model-ref with -o json would print two documents: run gpupass model push RUN REF -o json after the command")}
	}
	return nil
}

// PushModel runs `gpupass model push` for p in-process, in the command's
// output format, its flags not named here coming from the GPUPASS_*
// variables as on any command. Its errors are printed by it; the error
// returned only carries its exit code.
func (g *GlobalOptions) PushModel(ctx context.Context, p ModelPush, out, errOut io.Writer) error {
	if g == nil || g.run == nil {
		return errors.New("--model-ref: this gpupass was built without the model command")
	}
	args := []string{"-o", string(g.format()), "model", "push"}
	if g.Verbose {
		args = append(args, "--verbose")
	}
	if g.Context != "" {
		args = append(args, "--context", g.Context)
	}
	// In-process arguments: the token is in no process's argv.
	for _, kv := range append([][2]string{{"broker-url", p.Broker.URL}, {"broker-token", p.Broker.Token}, {"tls-ca", p.Broker.TLSCA}, {"audit", p.Audit}}, p.Sign...) {
		if kv[1] != "" {
			args = append(args, "--"+kv[0], kv[1])
		}
	}
	if p.Broker.InsecureHTTP {
		args = append(args, "--insecure-http")
	}
	args = append(args, "--", p.AllocationID, p.Ref)
	if code := g.run(ctx, args, out, errOut); code != 0 {
		return &ExitError{Code: code, Err: nil}
	}
	return nil
}

// modelRefRuns is the one run whose model --model-ref pushes, or the
// usage error naming flag (--model-ref, or the input) when there are
// several.
func modelRefRuns(flag string, n int) error {
	if n != 1 {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s pushes one run's model, and this step has %d runs: train one region per step, or push each run's model with gpupass model push RUN REF", flag, n)}
	}
	return nil
}
