// Package modelcmd holds the model-provenance commands: `gpupass model
// push` (a run's model to an OCI registry with a signed in-toto
// attestation of where it came from) and `gpupass model verify`. They link
// the registry client and sigstore; cmd/gpupass links them in (Command).
package modelcmd

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/app/modelprov"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/keylessflags"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/command/registryflags"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/model"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// PushOptions are the options of `gpupass model push RUN REF`.
type PushOptions struct {
	AllocationID string
	Ref          string
	File         string
	Audit        string
	Commit       string
	Key          string
	// Password decrypts Key; nil: COSIGN_PASSWORD.
	Password []byte
	// Sigstore signs keyless, as `gpupass audit` does: the default
	// without --key whenever the job has an OIDC identity.
	Sigstore keylessflags.Sign
	MaxSize  string
	Registry registryflags.Flags
	Broker   gpupass.BrokerFlags
	Output   output.Format
	Getenv   func(string) string
	Log      *slog.Logger
	// ErrOut receives the CI log group markers (-o github|gitlab).
	ErrOut io.Writer
}

// AddFlags registers the flags of `gpupass model push`.
func (o *PushOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.File, "file", "", "push this file instead of the run's newest checkpoint from the broker (a run ships its checkpoints with gpupass train --resume-elsewhere)")
	f.StringVar(&o.Audit, "audit", "", "the run's audit report zip (gpupass audit RUN): its sha256 goes into the attestation")
	f.StringVar(&o.Commit, "commit", "", "the commit the model was trained from (default: the CI job's, GITHUB_SHA or CI_COMMIT_SHA)")
	f.StringVar(&o.Key, "key", "", "cosign private key to sign the attestation with: a file, env://VAR or the PEM itself (password in --key-password or COSIGN_PASSWORD); without it the job's OIDC identity signs keyless")
	gpupass.MarkSecret("key")
	f.Var(keylessflags.Password(&o.Password), "key-password", "password of --key (default: $COSIGN_PASSWORD)")
	gpupass.MarkSecret("key-password")
	o.Sigstore.AddFlags(f, "the keyless attestation")
	f.StringVar(&o.MaxSize, "max-size", "16GiB", "largest model file pushed (e.g. 500MiB, 64GiB)")
	o.Registry.AddFlags(f)
	o.Broker.AddFlags(cmd)
}

// VerifyOptions are the options of `gpupass model verify REF`.
type VerifyOptions struct {
	Ref string
	Key string
	// Keyless names the identity a keyless attestation must have.
	Keyless  keylessflags.Verify
	Out      string
	MaxSize  string
	Registry registryflags.Flags
	Output   output.Format
	Getenv   func(string) string
}

// AddFlags registers the flags of `gpupass model verify`.
func (o *VerifyOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.Key, "key", "", "cosign public key the attestation must be signed with: a file, env://VAR or the PEM itself (or the keyless identity flags)")
	o.Keyless.AddFlags(f, "attestation")
	f.StringVar(&o.Out, "out", "", "also write the model file here once its bytes verified (never overwrites)")
	f.StringVar(&o.MaxSize, "max-size", "16GiB", "largest model file downloaded to check its bytes")
	o.Registry.AddFlags(f)
}

func newModelCmd(g *gpupass.GlobalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Push a run's model to an OCI registry with signed provenance, and verify it",
		Long: `A model is pushed as an OCI 1.1 artifact (one layer: the file) with a
signed in-toto attestation attached as cosign attaches one: the predicate
` + model.PredicateType + ` names the run, its spec's fingerprint, the
digest of each node's signed run report, the commit, the final metrics, the
audit report's digest and the model file's digest. See
docs/model-provenance.md.`,
	}
	po := &PushOptions{}
	push := &cobra.Command{
		Use:   "push RUN REF [--key cosign.key] [--file FILE] [--audit audit-report.zip]",
		Short: "Push a finished run's model with a signed attestation of its provenance",
		Long: `Push the newest checkpoint the run shipped to the broker (a run submitted
with gpupass train --resume-elsewhere ships them), or the file --file names,
to REF (REGISTRY/REPOSITORY:TAG) as an OCI artifact, then attach an in-toto
attestation of its provenance. The evidence comes from the broker alone:
the run must have ended and its node must have sent its signed run report.

Signing is what 'gpupass audit' does: --key cosign.key signs offline;
without --key the job's OIDC identity signs keyless (GitHub Actions'
id-token endpoint with permissions: id-token: write, GitLab's
SIGSTORE_ID_TOKEN, elsewhere --identity-token), through the Fulcio, Rekor
and timestamp authority of --signing-config (default: the public-good
Sigstore instance's). Push prints who signed and the command that
verifies it against that identity.

The attestation is found through the registry's referrers API or, on a
registry without it, the sha256-<digest> tag, as cosign and oras look for
it: cosign verify-attestation, cosign tree and oras discover show it.
Prints the model's digest reference and the command that verifies it.

As a CI step (-o github or -o gitlab; what the train and audit steps'
model-ref input runs) it also hands the digest reference on, as the step
output model-digest-ref (GitHub) or GPUPASS_MODEL_DIGEST_REF in the dotenv
report (GitLab), and on GitHub writes it, who signed and the verify
command into the job summary.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return errors.New("want RUN REF: the run's allocation id (gpupass runs lists them) and where to push, REGISTRY/REPOSITORY:TAG")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			po.AllocationID, po.Ref = args[0], args[1]
			po.Output = g.Output
			po.Log = g.Logger(cmd.ErrOrStderr())
			po.ErrOut = cmd.ErrOrStderr()
			return RunPush(cmd.Context(), *po, cmd.OutOrStdout())
		},
	}
	po.AddFlags(push)
	gpupass.CICommand(push)

	vo := &VerifyOptions{}
	verify := &cobra.Command{
		Use:   "verify REF --key cosign.pub|--certificate-identity ID --certificate-oidc-issuer URL",
		Short: "Verify a pushed model: its attestation, its provenance and its bytes",
		Long: `Verify the model at REF layer by layer: the artifact is a gpupass model;
an attestation refers to it (referrers API or the sha256-<digest> tag); its
signature verifies with --key or, signed keyless, its certificate names
--certificate-identity (or --certificate-identity-regexp) from
--certificate-oidc-issuer and its log entry and signed timestamp check
against --trusted-root (default: the public-good Sigstore instance's), and
the signer is printed (repository, workflow, ref, commit); its statement is of predicate type
` + model.PredicateType + `, about exactly this manifest, and names the
model file's digest and size; and the model's bytes, downloaded, hash to that
digest (cosign checks the manifest only: a model changed in the registry's
storage passes cosign and fails here). Prints the provenance once verified.

Exit codes: 0 every layer ok, 1 a layer failed (the first is named), 2 a
usage or I/O error (neither --key nor an identity, an unreadable key, a
registry that cannot be reached).`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return errors.New("want REF: the model's REGISTRY/REPOSITORY@sha256:… as gpupass model push printed it (or a tag)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			vo.Ref = args[0]
			vo.Output = g.Output
			return RunVerify(cmd.Context(), *vo, cmd.OutOrStdout())
		},
	}
	vo.AddFlags(verify)
	output.Supports(verify, output.Text, output.JSON)
	cmd.AddCommand(push, verify)
	return cmd
}

func getenvOr(f func(string) string) func(string) string {
	if f != nil {
		return f
	}
	return os.Getenv
}

func maxSize(flag, v string) (int64, error) {
	n, err := spec.ParseSize(v)
	if err != nil || n <= 0 {
		return 0, &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("--%s %q: want a size such as 500MiB or 16GiB", flag, v)}
	}
	return n, nil
}

func registryOptions(f registryflags.Flags) (bundle.RegistryOptions, error) {
	r := f.Options(buildinfo.UserAgent("gpupass"))
	if err := r.Validate(); err != nil {
		return bundle.RegistryOptions{}, err
	}
	return r, nil
}

// RunPush pushes the run's model and attaches its signed attestation.
func RunPush(ctx context.Context, o PushOptions, out io.Writer) error {
	getenv := getenvOr(o.Getenv)
	kind, isCI := gpupass.CIOutput(o.Output)
	env := ci.New(kind, getenv, o.ErrOut)
	defer env.Group("gpupass model push")()
	cfg, err := o.Sigstore.Config(o.Key, false)
	if err != nil {
		return err
	}
	dec, err := audit.Decide(cfg, getenv)
	if err != nil {
		return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: err}
	}
	limit, err := maxSize("max-size", o.MaxSize)
	if err != nil {
		return err
	}
	reg, err := registryOptions(o.Registry)
	if err != nil {
		return err
	}
	if o.Key != "" {
		key, done, err := gpupass.KeyFile("--key", o.Key)
		if err != nil {
			return err
		}
		defer done()
		cfg.KeyRef = audit.KeyRef(key)
	}
	signer, err := audit.NewSigner(ctx, dec, cfg, audit.SignerOptions{
		Key: cfg.KeyRef, Password: o.Password, SigningConfig: o.Sigstore.SigningConfig, TrustedRoot: o.Sigstore.TrustedRoot,
	}, getenv, o.Log)
	if err != nil {
		var fe *fielderr.Error
		if errors.As(err, &fe) {
			return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: err}
		}
		return err
	}
	rc, err := o.Broker.DialRuns()
	if err != nil {
		return err
	}
	res, err := modelprov.Push(ctx, rc, modelprov.PushOptions{
		AllocationID: o.AllocationID, Ref: o.Ref, Registry: reg, File: o.File, Audit: o.Audit,
		Commit: o.Commit, MaxBytes: limit, Signer: signer, Getenv: getenv, Log: o.Log,
	})
	if err != nil {
		var fe *fielderr.Error
		if errors.As(err, &fe) {
			return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: err}
		}
		return err
	}
	p := pushed{PushResult: res}
	if ks, ok := signer.(*audit.KeylessSigner); ok {
		p.SignerIdentity, p.SignerIssuer = ks.Identity()
		p.verify = keylessVerifyCommand(res.Reference, p.SignerIdentity, p.SignerIssuer, o.Sigstore.TrustedRoot, o.Registry.PlainHTTP)
	} else {
		p.verify = verifyCommand(res.Reference, o.Key, o.Registry.PlainHTTP)
	}
	if err := output.Write(out, o.Output, p); err != nil {
		return err
	}
	if !isCI {
		return nil
	}
	if err := env.SetOutput("model-digest-ref", res.Reference); err != nil {
		return err
	}
	return env.Summary(p.summary())
}

// summary is the CI step's job summary: the digest reference, who
// signed, and the command that verifies the model, to paste. It holds
// nothing of the registry login.
func (p pushed) summary() string {
	var b strings.Builder
	cell := strings.NewReplacer("|", "\\|", "`", "'", "\n", " ").Replace
	r := p.PushResult
	b.WriteString("### gpupass model push\n\n")
	if r.Predicate.Simulated {
		b.WriteString("**SIMULATED**: the run used a simulated hardware profile; its provenance proves nothing about real hardware.\n\n")
	}
	fmt.Fprintf(&b, "Pushed `%s` (%d bytes) of run `%s` with its signed provenance (`%s`).\n\n", cell(r.Model.Name), r.Model.Size, cell(r.Predicate.Run.ID), r.PredicateType)
	b.WriteString("| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| model | `%s` |\n", cell(r.Reference))
	fmt.Fprintf(&b, "| attestation | `%s` |\n", cell(r.Attestation))
	if p.SignerIdentity != "" {
		fmt.Fprintf(&b, "| signed keyless by | `%s` |\n| OIDC issuer | `%s` |\n", cell(p.SignerIdentity), cell(p.SignerIssuer))
	} else {
		b.WriteString("| signed with | a cosign key |\n")
	}
	b.WriteString("\nVerify it (the model's bytes too) with:\n\n```sh\n" + p.verify + "\n```\n")
	return b.String()
}

// keylessVerifyCommand verifies what was pushed against the identity
// that signed it, as the user pastes it.
func keylessVerifyCommand(ref, identity, issuer, trustedRoot string, plainHTTP bool) string {
	cmd := "gpupass model verify " + termsafe.ShellQuote(ref) + keylessflags.VerifyArgs(identity, issuer, trustedRoot)
	if plainHTTP {
		cmd += " --plain-http"
	}
	return cmd
}

// verifyCommand is the command that verifies what was pushed, as the
// user pastes it: the public key next to a cosign.key file (cosign.pub),
// else the name to fill in.
func verifyCommand(ref, key string, plainHTTP bool) string {
	pub := "cosign.pub"
	if k, ok := strings.CutSuffix(key, ".key"); ok && !strings.Contains(key, "-----BEGIN") {
		if _, err := os.Stat(k + ".pub"); err == nil {
			pub = k + ".pub"
		}
	}
	cmd := "gpupass model verify " + termsafe.ShellQuote(ref) + " --key " + termsafe.ShellQuote(pub)
	if plainHTTP {
		cmd += " --plain-http"
	}
	return cmd
}

// pushed is what `model push` prints; as JSON, the PushResult and the
// verify command.
type pushed struct {
	*model.PushResult
	// SignerIdentity and SignerIssuer are a keyless signature's
	// certificate identity and OIDC issuer, as `audit` names them.
	SignerIdentity, SignerIssuer string
	verify                       string
}

func (p pushed) WriteJSON(w io.Writer) error {
	return output.WriteJSON(w, struct {
		*model.PushResult
		SignerIdentity string `json:"signer_identity,omitempty"`
		SignerIssuer   string `json:"signer_issuer,omitempty"`
		Verify         string `json:"verify_command"`
	}{p.PushResult, p.SignerIdentity, p.SignerIssuer, p.verify})
}

func (p pushed) WriteText(w io.Writer) error {
	var b strings.Builder
	r := p.PushResult
	if r.Predicate.Simulated {
		b.WriteString("!!! SIMULATED: the run used a simulated hardware profile; its provenance proves nothing about real hardware !!!\n")
	}
	fmt.Fprintf(&b, "pushed %s (%d bytes, sha256:%s, %s) of run %s\n", termsafe.String(r.Model.Name), r.Model.Size, r.Model.SHA256, r.Model.Source, r.Predicate.Run.ID)
	fmt.Fprintf(&b, "  %s\n", r.Reference)
	fmt.Fprintf(&b, "attested %s\n  %s\n", r.PredicateType, r.Attestation)
	if p.SignerIdentity != "" {
		fmt.Fprintf(&b, "signed keyless as %s (OIDC issuer %s)\n", termsafe.String(p.SignerIdentity), termsafe.String(p.SignerIssuer))
	}
	fmt.Fprintf(&b, "verify it (the model's bytes too):\n  %s\n", p.verify)
	if strings.Contains(p.verify, " --key cosign.pub") {
		if _, err := os.Stat("cosign.pub"); err != nil {
			b.WriteString("  (cosign.pub is the public half of --key: `cosign public-key --key cosign.key > cosign.pub` writes it)\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// RunVerify verifies a pushed model and prints each layer.
func RunVerify(ctx context.Context, o VerifyOptions, out io.Writer) error {
	getenv := getenvOr(o.Getenv)
	if o.Key != "" && (o.Keyless.CertIdentity != "" || o.Keyless.CertIdentityRegexp != "") {
		return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: errors.New("--key and --certificate-identity exclude each other: name the key or the keyless identity the attestation must have")}
	}
	identity, err := o.Keyless.Identity(func(n string) string { return "--" + n })
	if err != nil {
		return err
	}
	if o.Key == "" && identity == nil {
		return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: errors.New("--key is required: the cosign public key (cosign.pub) the attestation must be signed with; for an attestation signed keyless, --certificate-identity (or --certificate-identity-regexp) and --certificate-oidc-issuer instead")}
	}
	limit, err := maxSize("max-size", o.MaxSize)
	if err != nil {
		return err
	}
	reg, err := registryOptions(o.Registry)
	if err != nil {
		return err
	}
	var pub crypto.PublicKey
	if o.Key != "" {
		key, done, err := gpupass.KeyFile("--key", o.Key)
		if err != nil {
			return err
		}
		defer done()
		if pub, _, err = audit.LoadPublicKey(audit.KeyRef(key), getenv); err != nil {
			return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("--key: %w", err)}
		}
	}
	res, err := model.Verify(ctx, o.Ref, model.VerifyOptions{Registry: reg, Key: pub, Identity: identity, MaxBytes: limit, Out: o.Out})
	if err != nil {
		return err
	}
	if err := output.Write(out, o.Output, verified{res}); err != nil {
		return err
	}
	if !res.OK {
		return gpupass.Findings(fmt.Errorf("model %s: the %s layer failed", o.Ref, res.FailedLayer))
	}
	return nil
}

// verified is what `model verify` prints; as JSON, the Result.
type verified struct{ *model.Result }

func (v verified) WriteJSON(w io.Writer) error { return output.WriteJSON(w, v.Result) }

func (v verified) WriteText(w io.Writer) error {
	var b strings.Builder
	r := v.Result
	for _, l := range r.Layers {
		status := map[string]string{audit.StatusOK: "ok  ", audit.StatusFail: "FAIL", audit.StatusSkipped: "skip"}[l.Status]
		fmt.Fprintf(&b, "%s %-12s %s\n", status, l.Name, termsafe.String(l.Detail))
		for _, p := range l.Problems {
			where := ""
			if p.File != "" {
				where = termsafe.String(p.File) + ": "
			}
			fmt.Fprintf(&b, "       %s%s (%s)\n", where, termsafe.String(p.Message), p.Check)
		}
	}
	if p := r.Predicate; p != nil && r.OK {
		if p.Simulated {
			b.WriteString("!!! SIMULATED: the run used a simulated hardware profile; its provenance proves nothing about real hardware !!!\n")
		}
		fmt.Fprintf(&b, "provenance (%s):\n", r.PredicateType)
		if sb := r.SignedBy; sb != nil {
			fmt.Fprintf(&b, "  signed by %s (OIDC issuer %s)\n", termsafe.String(sb.Identity), termsafe.String(sb.Issuer))
			for _, kv := range [][2]string{{"repository", sb.Repository}, {"workflow", sb.Workflow}, {"ref", sb.Ref}, {"commit", sb.Commit}} {
				if kv[1] != "" {
					fmt.Fprintf(&b, "            %s %s\n", kv[0], termsafe.String(kv[1]))
				}
			}
			if !sb.SignedAt.IsZero() {
				fmt.Fprintf(&b, "            signed at %s (signed timestamp)\n", sb.SignedAt.UTC().Format(time.RFC3339))
			}
		}
		fmt.Fprintf(&b, "  model     %s, %d bytes, sha256:%s (%s)\n", termsafe.String(p.Model.Name), p.Model.Size, p.Model.SHA256, p.Model.Source)
		fmt.Fprintf(&b, "  run       %s (group %s, region %s, %s)\n", termsafe.String(p.Run.ID), termsafe.String(p.Run.Group), termsafe.String(p.Run.Region), termsafe.String(p.Run.State))
		fmt.Fprintf(&b, "  spec      %s\n", termsafe.String(p.SpecFingerprint))
		for _, n := range p.Nodes {
			fmt.Fprintf(&b, "  node      %s: run report sha256:%s, agent key sha256:%s, measured %s\n", termsafe.String(n.NodeID), n.RunReportSHA256, n.AgentKeySHA256, termsafe.String(n.RuntimeFingerprint))
		}
		if c := p.Commit; c != nil {
			fmt.Fprintf(&b, "  commit    %s %s (from %s)\n", termsafe.String(c.SHA), termsafe.String(c.Repository), termsafe.String(c.Source))
		}
		if m := p.Metrics; m != nil {
			fmt.Fprintf(&b, "  metrics   last step %d:", m.LastStep)
			for _, k := range sortedKeys(m.Values) {
				fmt.Fprintf(&b, " %s=%g", termsafe.String(k), m.Values[k])
			}
			b.WriteString("\n")
		}
		if a := p.Audit; a != nil {
			fmt.Fprintf(&b, "  audit     %s, sha256:%s\n", termsafe.String(a.Name), a.SHA256)
		}
	}
	if r.OK {
		fmt.Fprintf(&b, "verified %s\n", r.Reference)
	} else {
		fmt.Fprintf(&b, "FAILED %s: layer %s\n", r.Reference, r.FailedLayer)
	}
	if r.Written != "" {
		fmt.Fprintf(&b, "wrote %s\n", r.Written)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
