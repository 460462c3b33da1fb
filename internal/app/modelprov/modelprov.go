// Package modelprov is the model-provenance use case: read a finished run's
// evidence from the broker (its spec fingerprint, the node's signed run
// report, its final metrics, its newest shipped checkpoint), push the model
// with a signed attestation of it (internal/model), and verify a pushed
// model. The gpupass command renders its typed results; it imports no
// cobra and prints nothing.
package modelprov

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/model"
	"github.com/gpupass/gpupass/internal/runview"
)

// Fields of the option errors (*fielderr.Error), for the command layer
// to name its flags.
const (
	FieldAudit  = "audit report"
	FieldCommit = "commit"
)

// PushOptions say which run's model to push where, and how to sign.
type PushOptions struct {
	AllocationID string
	Ref          string
	Registry     bundle.RegistryOptions
	// File, when set, is pushed instead of the run's newest shipped
	// checkpoint.
	File string
	// Audit is the run's audit report zip, whose digest is attested.
	Audit string
	// Commit overrides the commit of the CI job (GITHUB_SHA,
	// CI_COMMIT_SHA).
	Commit   string
	MaxBytes int64
	// Signer signs the attestation (audit.NewSigner: a key, or keyless).
	Signer audit.Signer
	Getenv func(string) string
	Log    *slog.Logger
}

// Push reads the run's evidence from the broker, then pushes the model
// with its attestation.
func Push(ctx context.Context, rc *client.RunClients, o PushOptions) (*model.PushResult, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// What the user named is checked before the broker and the registry
	// are asked for anything.
	if err := model.CheckPush(o.Ref, o.File, o.MaxBytes, o.Registry); err != nil {
		return nil, err
	}
	p, err := Evidence(ctx, rc, o.AllocationID)
	if err != nil {
		return nil, err
	}
	p.Commit = commit(o.Commit, getenv)
	if o.Audit != "" {
		if p.Audit, err = auditFile(ctx, o.Audit, o.AllocationID); err != nil {
			return nil, err
		}
	}
	path, name, source := o.File, "", model.SourceFile
	if o.File == "" {
		dir, err := os.MkdirTemp("", "gpupass-model-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		ck, err := fetchCheckpoint(ctx, rc, o.AllocationID, dir, true)
		if err != nil {
			return nil, err
		}
		path, name, source = ck.path, ck.name, model.SourceCheckpoint
	} else if ck, err := fetchCheckpoint(ctx, rc, o.AllocationID, "", false); err == nil {
		// The file is the run's own checkpoint when its bytes are.
		if sum, err := fileSHA256(o.File); err == nil && sum == ck.sha256 {
			name, source = ck.name, model.SourceCheckpoint
		}
	}
	if p.Simulated {
		log.Warn("SIMULATED: the run measured a simulated hardware profile; the model's provenance proves nothing about real hardware", "allocation", o.AllocationID)
	}
	return model.Push(ctx, o.Ref, model.PushOptions{
		Registry: o.Registry, Path: path, Name: name, Predicate: p, Source: source,
		Signer: o.Signer, MaxBytes: o.MaxBytes,
	})
}

// Evidence is the predicate of the run's provenance, but the model: read
// from the broker's record (GetRunEvidence, GetMetrics), with the node's
// run report checked against its agent key.
func Evidence(ctx context.Context, rc *client.RunClients, allocID string) (model.Predicate, error) {
	er, err := rc.Run.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: allocID}))
	if err != nil {
		return model.Predicate{}, fmt.Errorf("reading the evidence of %s: %w", allocID, err)
	}
	ev := er.Msg
	run := ev.GetRun()
	if err := conformance.Verify(ev.AgentPublicKeyPem, ev.Report, ev.Signature); err != nil {
		return model.Predicate{}, fmt.Errorf("run %s: the node's run report does not verify with its agent key: %w", allocID, err)
	}
	rep, err := conformance.Parse(ev.Report)
	if err != nil {
		return model.Predicate{}, fmt.Errorf("run %s: %w", allocID, err)
	}
	pub, err := conformance.ParsePublicKey(ev.AgentPublicKeyPem)
	if err != nil {
		return model.Predicate{}, fmt.Errorf("run %s: %w", allocID, err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return model.Predicate{}, err
	}
	reportSum, keySum := sha256.Sum256(ev.Report), sha256.Sum256(der)
	mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: allocID}))
	if err != nil {
		return model.Predicate{}, fmt.Errorf("reading metrics of %s: %w", allocID, err)
	}
	var pts []model.MetricPoint
	for _, p := range mr.Msg.Points {
		pts = append(pts, model.MetricPoint{Step: p.Step, Values: p.Values})
	}
	return model.Predicate{
		SpecFingerprint: run.GetSpecFingerprint(),
		Run:             model.Run{ID: run.GetId(), Group: run.GetGroup(), Region: run.GetRegion(), State: runview.State(run.GetState())},
		Nodes: []model.Node{{
			NodeID: run.GetNodeId(), RunReportSHA256: hex.EncodeToString(reportSum[:]),
			AgentKeySHA256: hex.EncodeToString(keySum[:]), RuntimeFingerprint: rep.RuntimeFingerprint,
		}},
		Metrics:        model.FinalMetrics(pts),
		Simulated:      run.GetSimulated() || rep.Simulated,
		GpupassVersion: buildinfo.Get().Version,
	}, nil
}

// commit is the flag's commit, else the CI job's.
func commit(flag string, getenv func(string) string) *model.Commit {
	if flag != "" {
		return &model.Commit{SHA: flag, Source: "flag"}
	}
	switch {
	case getenv("GITHUB_ACTIONS") == "true" && getenv("GITHUB_SHA") != "":
		return &model.Commit{SHA: getenv("GITHUB_SHA"), Repository: getenv("GITHUB_REPOSITORY"), Source: "ci"}
	case getenv("GITLAB_CI") == "true" && getenv("CI_COMMIT_SHA") != "":
		return &model.Commit{SHA: getenv("CI_COMMIT_SHA"), Repository: getenv("CI_PROJECT_PATH"), Source: "ci"}
	}
	return nil
}

// auditFile is the audit zip's digest, once its manifest says it is the
// audit of this run.
func auditFile(ctx context.Context, path, allocID string) (*model.File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fielderr.New(FieldAudit, path, "%w", err)
	}
	if fi.Size() > audit.DefaultLimits.MaxTotal {
		return nil, fielderr.New(FieldAudit, path, "is %d bytes, larger than an audit report may be (%d)", fi.Size(), audit.DefaultLimits.MaxTotal)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fielderr.New(FieldAudit, path, "%w", err)
	}
	// No key: only the archive and the manifest's allocation are read
	// here; `gpupass audit verify` checks the rest.
	if r := audit.Verify(ctx, b, audit.VerifyOptions{}); r.AllocationID != allocID {
		if r.AllocationID == "" {
			return nil, fielderr.New(FieldAudit, path, "is not an audit report (make one with `gpupass audit %s`)", allocID)
		}
		return nil, fielderr.New(FieldAudit, path, "is the audit report of %s, not of %s", r.AllocationID, allocID)
	}
	sum := sha256.Sum256(b)
	return &model.File{Name: filepath.Base(path), SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))}, nil
}

type checkpoint struct {
	name, sha256, path string
}

// ErrNoCheckpoint is a run that shipped none.
var ErrNoCheckpoint = errors.New("no checkpoint")

// fetchCheckpoint asks the broker for the run's newest shipped checkpoint;
// with download it writes the bytes into dir, checked against the digest
// and size the broker states, at most api.MaxCheckpointBytes.
func fetchCheckpoint(ctx context.Context, rc *client.RunClients, allocID, dir string, download bool) (*checkpoint, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := rc.Run.GetCheckpoint(ctx, connect.NewRequest(&gpupassv1.GetCheckpointRequest{AllocId: allocID}))
	if err != nil {
		return nil, fmt.Errorf("fetching the checkpoint of %s: %w", allocID, err)
	}
	defer st.Close()
	if !st.Receive() {
		err := st.Err()
		if err == nil {
			err = ErrNoCheckpoint
		}
		if connect.CodeOf(err) == connect.CodeFailedPrecondition || errors.Is(err, ErrNoCheckpoint) {
			// Nothing to fetch: the user names the model instead.
			return nil, &fielderr.Error{Field: model.FieldFile, Problem: fmt.Sprintf("names the model to push when the broker holds no checkpoint of the run (%v)", err), Err: ErrNoCheckpoint}
		}
		return nil, fmt.Errorf("fetching the checkpoint of %s: %w", allocID, err)
	}
	first := st.Msg()
	if err := api.CheckpointName(first.Name); err != nil {
		return nil, fmt.Errorf("fetching the checkpoint of %s: the broker sent %w", allocID, err)
	}
	if first.Size < 0 || first.Size > api.MaxCheckpointBytes {
		return nil, fmt.Errorf("fetching the checkpoint of %s: the broker announces %d bytes, at most %d are shipped", allocID, first.Size, api.MaxCheckpointBytes)
	}
	ck := &checkpoint{name: first.Name, sha256: first.Sha256}
	if !download {
		return ck, nil
	}
	ck.path = filepath.Join(dir, first.Name)
	f, err := os.OpenFile(ck.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	w := io.MultiWriter(f, h)
	var n int64
	for msg := first; ; {
		if n += int64(len(msg.Data)); n > first.Size {
			return nil, fmt.Errorf("fetching the checkpoint of %s: the broker sent more than the %d bytes it announced", allocID, first.Size)
		}
		if _, err := w.Write(msg.Data); err != nil {
			return nil, err
		}
		if !st.Receive() {
			break
		}
		msg = st.Msg()
	}
	if err := st.Err(); err != nil {
		return nil, fmt.Errorf("fetching the checkpoint of %s: %w", allocID, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != first.Size || got != first.Sha256 {
		return nil, fmt.Errorf("fetching the checkpoint of %s: received %d bytes hashing to %s, the broker announced %d bytes of %s", allocID, n, got, first.Size, first.Sha256)
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return ck, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
