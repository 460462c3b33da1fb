// Package auditrun is the audit use case: read a finished run from a
// source, sign its audit report with a key or keyless, and write the zip,
// returning a typed Result. The gpupass command (a CI step with -o
// github|gitlab too) calls it: it chooses the source, passes the key's
// password as a value (never through the process environment) and
// renders the Result. It imports no cobra and prints nothing.
package auditrun

import (
	"context"
	"errors"
	"log/slog"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/buildinfo"
)

// Options say which run to audit and how to sign.
type Options struct {
	AllocationID string
	// Out is the zip to write.
	Out string
	// Source reads the run (the broker, or a run file).
	Source audit.Source
	// Key is the cosign private key reference (a file or env://VAR).
	Key string
	// Password decrypts Key; nil reads audit.PasswordEnv through Getenv,
	// as cosign does.
	Password []byte
	Keyless  bool
	Attest   bool
	// Group is written into the signed manifest (audit GROUP).
	Group      *audit.ManifestGroup
	TlogUpload bool
	// RekorURL records a key signature when TlogUpload is set.
	RekorURL string
	// SigningConfig and TrustedRoot are the files cosign's
	// --signing-config and --trusted-root name; empty: the public-good
	// Sigstore instance's, from its TUF repository (as cosign does).
	// The trusted root, when given, checks each keyless bundle once
	// signed.
	SigningConfig string
	TrustedRoot   string
	// IdentityToken is an OIDC token given outright (--identity-token).
	IdentityToken string
	// Getenv reads key references (env://VAR) and the CI's OIDC token.
	Getenv func(string) string
	Log    *slog.Logger
}

// Result is what was written.
type Result struct {
	Path           string `json:"path"`
	AllocationID   string `json:"allocation_id"`
	ManifestSHA256 string `json:"manifest_sha256"`
	Files          int    `json:"files"`
	Signing        string `json:"signing"`
	Attested       bool   `json:"attested"`
	Match          bool   `json:"fingerprint_match"`
	// Uncertified says which rank of a run across several nodes sent no
	// signed report or measured another environment (verify fails that
	// rank's layer); Match is then false.
	Uncertified string `json:"uncertified,omitempty"`
	Simulated   bool   `json:"simulated"`
	// LogProblem says why the run's log is disputed or incomplete.
	LogProblem string `json:"log_problem,omitempty"`
	// SignerIdentity and SignerIssuer are a keyless signature's
	// certificate identity and OIDC issuer: what verify is given.
	SignerIdentity string `json:"signer_identity,omitempty"`
	SignerIssuer   string `json:"signer_issuer,omitempty"`
	// SignedBy is what the keyless certificate names: repository,
	// workflow, ref, commit (the CI step's summary shows them).
	SignedBy *audit.SignedBy `json:"signed_by,omitempty"`
}

// ErrNoOut is Options.Out left empty.
var ErrNoOut = errors.New("no path to write the audit report zip to")

// Run builds, signs and writes the audit report of a finished run. A run
// still in progress is an error wrapping audit.ErrInProgress.
func Run(ctx context.Context, o Options) (*Result, error) {
	getenv, log := o.Getenv, o.Log
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Out == "" {
		return nil, ErrNoOut
	}
	cfg := audit.SignConfig{KeyRef: audit.KeyRef(o.Key), Keyless: o.Keyless, IDToken: o.IdentityToken, TlogUpload: o.TlogUpload}
	dec, err := audit.Decide(cfg, getenv)
	if err != nil {
		return nil, err
	}
	run, err := o.Source.Run(ctx, o.AllocationID)
	if err != nil {
		return nil, err
	}
	if err := run.Validate(); err != nil {
		return nil, err
	}
	signer, err := audit.NewSigner(ctx, dec, cfg, audit.SignerOptions{
		Key: audit.KeyRef(o.Key), Password: o.Password, RekorURL: o.RekorURL,
		SigningConfig: o.SigningConfig, TrustedRoot: o.TrustedRoot,
	}, getenv, log)
	if err != nil {
		return nil, err
	}
	rep, err := audit.Build(ctx, run, audit.BuildOptions{Signer: signer, Attest: o.Attest, Version: buildinfo.Get().Version, Group: o.Group})
	if err != nil {
		return nil, err
	}
	if err := audit.WriteFile(o.Out, rep.Zip); err != nil {
		return nil, err
	}
	if rep.Manifest.Simulated {
		log.Warn("SIMULATED: this audit report describes a run on a simulated hardware profile; it proves nothing about real hardware", "allocation", run.AllocationID)
	}
	res := &Result{
		Path: o.Out, AllocationID: run.AllocationID, ManifestSHA256: rep.ManifestSHA256,
		Files: len(rep.Manifest.Files) + 2, Signing: dec.Mode, Attested: o.Attest,
		Match: rep.Environment.Certified(), Simulated: rep.Manifest.Simulated,
		Uncertified: rep.Environment.Uncertified,
	}
	if ks, ok := signer.(*audit.KeylessSigner); ok {
		res.SignerIdentity, res.SignerIssuer = ks.Identity()
		sb := ks.SignedBy()
		res.SignedBy = &sb
	}
	if run.Log != nil && run.Log.Problem() != "" {
		// Recorded in run-summary.json; verify fails its log layer.
		res.LogProblem = run.Log.Problem()
		log.Warn(res.LogProblem+"; audit verify will fail the log layer", "allocation", run.AllocationID)
	}
	if res.Attested {
		res.Files++
	}
	return res, nil
}
