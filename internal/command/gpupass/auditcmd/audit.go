package auditcmd

import (
	"bytes"
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/app/auditrun"
	"github.com/gpupass/gpupass/internal/app/compare"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/keylessflags"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/termsafe"
	"github.com/spf13/cobra"
)

// The public Rekor: the default cosign's own --rekor-url has (its
// cli/options package is not imported: it drags in every cloud's
// credential helper). Keyless signing finds its services in the signing
// config instead.
const defaultRekorURL = "https://rekor.sigstore.dev"

// AuditOptions are the options of `gpupass audit ALLOC`.
type AuditOptions struct {
	AllocationID string
	// group is written into each report of a group (audit GROUP).
	group      *audit.ManifestGroup
	Out        string
	RunFile    string
	Broker     gpupass.BrokerFlags
	Key        string
	Keyless    bool
	Attest     bool
	TlogUpload bool
	// FulcioURL is the flag keyless signing had before signing
	// configs; setting it is refused, naming --signing-config.
	FulcioURL string
	RekorURL  string
	// SigningConfig, TrustedRoot and IdentityToken are cosign's flags of
	// the same names.
	SigningConfig string
	TrustedRoot   string
	IdentityToken string
	Output        output.Format
	// Password decrypts Key; nil: COSIGN_PASSWORD. --key-password sets
	// it (a pipeline's cosign-password input).
	Password []byte
	// ErrOut receives the CI log group markers (-o github|gitlab).
	ErrOut io.Writer
	// PostTo says where, besides the step summary, the audit says who
	// signed: the sticky report comment.
	PostTo PostFlags
	// ModelRef pushes the run's model once its audit is written
	// (--model-ref), through PushModel (the root's).
	ModelRef  string
	PushModel func(context.Context, gpupass.ModelPush, io.Writer, io.Writer) error

	// Source overrides the run source (the broker client, later; tests).
	Source audit.Source
	Getenv func(string) string
	Log    *slog.Logger
}

// AddFlags registers the flags of `gpupass audit`.
func (o *AuditOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.Out, "out", "audit-report.zip", "where to write the audit report zip")
	f.StringVar(&o.AllocationID, "allocation", "", "allocation id of the run to audit, instead of the ALLOC argument")
	f.Var(keylessflags.Password(&o.Password), "key-password", "password of --key (default: $COSIGN_PASSWORD)")
	gpupass.MarkSecret("key-password")
	// A pipeline passes the key itself (a secret input): masked in the log.
	gpupass.MarkSecret("key")
	f.StringVar(&o.ModelRef, "model-ref", "", "once the audit is written, push the run's model to this REGISTRY/REPOSITORY:TAG with its signed provenance naming the audit zip, as gpupass model push RUN REF --audit ZIP does (signed as the audit was; registry login from GPUPASS_REGISTRY_USERNAME/PASSWORD or the docker config); a failed push fails the command")
	f.StringVar(&o.RunFile, "run-file", "", "audit a JSON run record (audit.Run) instead of asking the broker (offline re-audits)")
	f.StringVar(&o.Key, "key", "", "cosign private key to sign with: a file, env://VAR or the PEM itself (password in --key-password or COSIGN_PASSWORD)")
	f.BoolVar(&o.Keyless, "keyless", false, "sign keyless, and fail unless the job has an OIDC identity (without --key that is the default whenever it has one)")
	f.StringVar(&o.IdentityToken, "identity-token", "", "OIDC token to sign keyless with, or a file holding it (default: SIGSTORE_ID_TOKEN, or GitHub Actions' id-token endpoint)")
	gpupass.MarkSecret("identity-token")
	f.StringVar(&o.SigningConfig, "signing-config", "", "signing config (cosign signing-config create) naming the Fulcio, Rekor and timestamp authority to sign keyless with (default: the public-good Sigstore instance's, from its TUF repository)")
	f.StringVar(&o.TrustedRoot, "trusted-root", "", "trusted root (cosign trusted-root create) to check each keyless bundle against once signed")
	f.BoolVar(&o.Attest, "attest", false, "also add an in-toto statement signed as a DSSE envelope")
	f.BoolVar(&o.TlogUpload, "tlog-upload", false, "with --key, also record the signature in Rekor (default: offline)")
	f.StringVar(&o.FulcioURL, "fulcio-url", "", "replaced by --signing-config")
	_ = f.MarkHidden("fulcio-url")
	f.StringVar(&o.RekorURL, "rekor-url", defaultRekorURL, "Rekor for --key --tlog-upload (keyless signing uses the signing config's)")
	o.Broker.AddFlags(cmd)
	o.PostTo.AddFlags(cmd)
}

// AuditVerifyOptions are the options of `gpupass audit verify ZIP`.
type AuditVerifyOptions struct {
	// Path is the zip to verify; Paths, when set, are several zips or
	// directories of zips (what `audit GROUP` writes), each verified
	// with the same keys.
	Path      string
	Paths     []string
	Key       string
	AgentKeys []string
	// The keyless signer a report must have: cosign verify-blob's flags
	// of the same names. TrustedRoot empty: the public-good instance's.
	CertIdentity, CertIdentityRegexp string
	CertIssuer, CertIssuerRegexp     string
	TrustedRoot                      string
	// RequirePinned makes a report checked only against the agent key
	// inside it a failure (exit 1) instead of a warning.
	RequirePinned bool
	Extract       string
	Output        output.Format
	Getenv        func(string) string
	// ErrOut receives the CI log group markers (-o github|gitlab).
	ErrOut io.Writer
}

// AddFlags registers the flags of `gpupass audit verify`.
func (o *AuditVerifyOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.Key, "key", "", "cosign public key the manifest must be signed with: a file, env://VAR or the PEM itself (or the keyless identity flags)")
	f.StringVar(&o.CertIdentity, "certificate-identity", "", "for a keyless report: the identity that must have signed it (GitHub: https://github.com/OWNER/REPO/.github/workflows/FILE@REF; GitLab: https://gitlab.com/GROUP/PROJECT//.gitlab-ci.yml@REF)")
	f.StringVar(&o.CertIdentityRegexp, "certificate-identity-regexp", "", "for a keyless report: a Go regular expression the signing identity must match, instead of --certificate-identity")
	f.StringVar(&o.CertIssuer, "certificate-oidc-issuer", "", "for a keyless report: the OIDC issuer of the signing identity (GitHub: https://token.actions.githubusercontent.com; GitLab: https://gitlab.com)")
	f.StringVar(&o.CertIssuerRegexp, "certificate-oidc-issuer-regexp", "", "for a keyless report: a Go regular expression the OIDC issuer must match, instead of --certificate-oidc-issuer")
	f.StringVar(&o.TrustedRoot, "trusted-root", "", "trusted root (cosign trusted-root create) for keyless reports (default: the public-good Sigstore instance's, from its TUF repository)")
	f.StringArrayVar(&o.AgentKeys, "agent-key", nil, "trusted agent public key (PEM) or key list (JSON [{pem,not_before,not_after}]): a file, env://VAR or the key itself; repeatable")
	f.BoolVar(&o.RequirePinned, "require-pinned", false, "fail (exit 1) unless the conformance report's agent key is pinned with --agent-key; without it an unpinned key is a warning")
	f.StringVar(&o.Extract, "extract", "", "also write the report's files into this directory (never overwrites)")
}

// AuditKeygenOptions are the options of `gpupass audit keygen`.
type AuditKeygenOptions struct {
	Prefix string
	Force  bool
	Output output.Format
	Getenv func(string) string
	Log    *slog.Logger
}

// AddFlags registers the flags of `gpupass audit keygen`.
func (o *AuditKeygenOptions) AddFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.Prefix, "out-prefix", "cosign", "write PREFIX.key and PREFIX.pub")
	cmd.Flags().BoolVar(&o.Force, "force", false, "replace an existing key pair")
}

func newAuditCmd(g *gpupass.GlobalOptions) *cobra.Command {
	o := &AuditOptions{}
	cmd := &cobra.Command{
		Use:   "audit ALLOC|GROUP|--allocation ALLOC|--run-file FILE [--out audit-report.zip|DIR]",
		Short: "Build a signed audit report of a finished run, verifiable with cosign",
		Long: `Build audit-report.zip for a finished run: the declared and measured
environment with their fingerprints, the agent's signed conformance report,
the hardware inventory and a run summary, listed in manifest.json, which is
signed as a cosign bundle (manifest.sigstore.json).

Signing: --key cosign.key (password in COSIGN_PASSWORD) signs offline.
Without --key, the job's OIDC identity signs keyless: in GitHub Actions
the id-token endpoint (the job needs permissions: id-token: write), in
GitLab SIGSTORE_ID_TOKEN (id_tokens: SIGSTORE_ID_TOKEN: aud: sigstore),
elsewhere --identity-token. The certificate comes from the Fulcio of
--signing-config (a file 'cosign signing-config create' writes; default:
the public-good Sigstore instance's), the signature is logged in its
Rekor and timestamped by its timestamp authority, and the bundle carries
all three; verify it with 'gpupass audit verify --certificate-identity
… --certificate-oidc-issuer …' or 'cosign verify-blob'.

The run comes from the broker alone (--broker-url, a read token for the
run's region; inside a 'gpupass up' stack nothing needs passing): its spec,
the agent's signed report for that run, the node and the metrics. A run
still in progress cannot be audited. The zip is named with --out.

A run group id (group-…, as gpupass train printed it) writes one complete
signed zip per run of the group, each what 'gpupass audit ALLOC' writes
for that run, into the directory --out names (left out: audit-GROUP/),
named by region: audit-us-west-2.zip, or audit-REGION-ALLOC.zip where a
region holds two runs of the group. If any run of the group has not
ended, nothing is written (gpupass wait GROUP waits for them); a run
that ended before it started ran nothing and gets no zip. Verify
them all with 'gpupass audit verify DIR'. -o is
the output format (text or json, or github or gitlab in a CI step), as
for every command.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if o.AllocationID != "" && o.AllocationID != args[0] {
					return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("allocation %s and --allocation %s: name the run once", args[0], o.AllocationID)}
				}
				o.AllocationID = args[0]
			}
			o.Output = g.Output
			if _, isCI := gpupass.CIOutput(o.Output); !isCI && o.AllocationID == "" && o.RunFile == "" {
				if err := gpupass.AllocArg(cmd, args); err != nil {
					return err
				}
			}
			o.Log = g.Logger(cmd.ErrOrStderr())
			o.ErrOut = cmd.ErrOrStderr()
			o.PostTo.Poster = g.Poster
			o.PushModel = g.PushModel
			return RunAudit(cmd.Context(), *o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	// -o is the format everywhere; `-o a.zip` (what -o means to many
	// tools that write a file) is refused with --out as the fix.
	output.WritesFileWith(cmd, "out", "the zip")
	gpupass.CICommand(cmd)

	vo := &AuditVerifyOptions{}
	verify := &cobra.Command{
		Use:   "verify audit-report.zip|DIR... --key cosign.pub|--certificate-identity ID --certificate-oidc-issuer URL [--agent-key agent.pub]",
		Short: "Verify an audit report layer by layer",
		Long: `Verify every layer of an audit report: the cosign signature over
manifest.json, every file against the manifest (no missing or extra files),
the agent's signature over the conformance report, and the report's
fingerprint against the declared one, the run's log, the attestation.

A report signed with a key verifies with --key cosign.pub. A report signed
keyless verifies with the identity that must have signed it, as cosign
verify-blob takes it: --certificate-identity (or
--certificate-identity-regexp) and --certificate-oidc-issuer, checked
against --trusted-root (default: the public-good Sigstore instance's);
the signer layer then says who signed: repository, workflow, ref, commit.

Each layer prints ok, warn, FAIL or skip. Without --agent-key the agent's
signature is checked only against the key inside the report, which whoever
built the report chose: that layer says "warn ... unpinned", and the report
still verifies (exit 0) unless --require-pinned is given. Pin the node's
public key (agent.pub in the agent's state dir, or the broker's key list)
with --agent-key. A layer that reads a file which failed the manifest check
is skipped, naming that file.

Several zips, or a directory (what 'gpupass audit GROUP' writes: every
.zip in it), are each verified with the same flags and printed in turn,
followed by the reports that failed, if any; with --extract each goes
into its own directory under it, named by its zip. -o json prints a list.

Exit codes: 0 every layer ok (or warn), 1 a layer failed or was skipped
(the first is named; with several zips, in any of them, each named), 2 a usage error (neither --key nor an identity, an unreadable key).`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("missing the audit report: name its zip (audit-report.zip), several zips, or the directory gpupass audit GROUP wrote")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			vo.Path = args[0]
			if len(args) > 1 {
				vo.Paths = args
			} else {
				vo.Paths = nil
			}
			vo.Output = g.Output
			vo.ErrOut = cmd.ErrOrStderr()
			return RunAuditVerify(cmd.Context(), *vo, cmd.OutOrStdout())
		},
	}
	vo.AddFlags(verify)
	gpupass.CICommand(verify)

	ko := &AuditKeygenOptions{}
	keygen := &cobra.Command{
		Use:   "keygen",
		Short: "Write a cosign-compatible key pair (cosign.key, cosign.pub)",
		Long: `Write an ECDSA P-256 key pair in cosign's format. The private key is
encrypted with COSIGN_PASSWORD (empty if unset) and written with mode 0600.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ko.Output = g.Output
			ko.Log = g.Logger(cmd.ErrOrStderr())
			return RunAuditKeygen(cmd.Context(), *ko, cmd.OutOrStdout())
		},
	}
	ko.AddFlags(keygen)
	// keygen is no CI step: it prints text or json, not audit's CI formats.
	output.Supports(keygen, output.Text, output.JSON)
	cmd.AddCommand(verify, keygen)
	return cmd
}

func auditGetenv(f func(string) string) func(string) string {
	if f != nil {
		return f
	}
	return os.Getenv
}

func auditLog(l *slog.Logger) *slog.Logger {
	if l != nil {
		return l
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// AuditResult is the JSON output of `gpupass audit`.
type AuditResult = auditrun.Result

// RunAudit builds, signs and writes the audit report of a finished run.
func RunAudit(ctx context.Context, o AuditOptions, out io.Writer) (err error) {
	kind, isCI := gpupass.CIOutput(o.Output)
	env := ci.New(kind, auditGetenv(o.Getenv), o.ErrOut)
	// Closed before a --model-ref push opens its own: groups do not nest.
	endGroup := sync.OnceFunc(env.Group("gpupass audit"))
	defer endGroup()
	group := strings.HasPrefix(o.AllocationID, api.GroupIDPrefix)
	if group {
		o.Out = GroupOut(o.AllocationID, o.Out)
	}
	if o.PostTo.Post == "" {
		o.PostTo.Post = string(compare.PostNone) // options built without the flags
	}
	if _, err := compare.ParsePostMode(o.PostTo.Post); err != nil {
		return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("%s %q: must be auto, github, gitlab or none", gpupass.CIFlag(o.Output, "post"), o.PostTo.Post)}
	}
	if o.ModelRef != "" {
		if group {
			return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("%s pushes one run's model, and %s is a run group: audit one run of it, or push each run's model with gpupass model push RUN REF --audit ZIP", gpupass.CIFlag(o.Output, "model-ref"), o.AllocationID)}
		}
		if o.Output == output.JSON {
			return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: errors.New("--model-ref with -o json would print two documents: run gpupass model push RUN REF --audit ZIP -o json after the audit")}
		}
	}
	if o.FulcioURL != "" {
		return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: errors.New("--fulcio-url is replaced by --signing-config FILE: write one naming your Fulcio, Rekor and timestamp authority with `cosign signing-config create`")}
	}
	if o.IdentityToken != "" {
		tok, err := keylessflags.IdentityToken(o.IdentityToken)
		if err != nil {
			return err
		}
		o.IdentityToken = tok
	}
	if isCI {
		// A pipeline signs with its key, or keyless with the job's own
		// identity when it has one and no key is given (audit.Decide
		// says what a job lacking both must add).
		if o.AllocationID == "" && o.RunFile == "" {
			return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("audit: missing %s (or %s)", gpupass.CIFlag(o.Output, "allocation"), gpupass.CIFlag(o.Output, "run-file"))}
		}
		if _, err := audit.Decide(audit.SignConfig{Keyless: o.Keyless, IDToken: o.IdentityToken}, auditGetenv(o.Getenv)); o.Key == "" && err != nil {
			hint := audit.MissingIdentity(auditGetenv(o.Getenv))
			if hint == "" {
				hint = "pass " + gpupass.CIFlag(o.Output, "identity-token")
			}
			return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("audit: missing %s, or an OIDC identity to sign keyless: %s", gpupass.CIFlag(o.Output, "key"), hint)}
		}
		defer func() {
			if err == nil {
				err = env.SetOutput("audit-path", o.Out)
			}
		}()
	}
	if o.Key != "" {
		key, done, err := gpupass.KeyFile(gpupass.CIFlag(o.Output, "key"), o.Key)
		if err != nil {
			return err
		}
		defer done()
		o.Key = key
	}
	if group {
		written, err := o.auditGroup(ctx)
		if err != nil {
			return err
		}
		if err := output.Write(out, o.Output, groupPrinted{written, o.Out, o.TrustedRoot}); err != nil {
			return err
		}
		if isCI {
			if err := env.Summary(written.summary(o.AllocationID, o.Out, o.TrustedRoot)); err != nil {
				return err
			}
		}
		o.postSection(ctx, signedBySection(o.Out, written.mode(), written.signedBy(), o.TrustedRoot))
		return nil
	}
	res, err := o.auditOne(ctx)
	if err != nil {
		return err
	}
	if err := output.Write(out, o.Output, auditWritten{res, o.TrustedRoot}); err != nil {
		return err
	}
	if isCI {
		wrote := fmt.Sprintf("Wrote `%s` (allocation `%s`, %d files), signed with %s.", res.Path, res.AllocationID, res.Files, res.Signing)
		if err := env.Summary(auditSummary(wrote, res.Simulated, res.SignedBy, res.Path, o.TrustedRoot)); err != nil {
			return err
		}
	}
	o.postSection(ctx, signedBySection(res.Path, res.Signing, res.SignedBy, o.TrustedRoot))
	endGroup()
	return o.pushModel(ctx, res, out)
}

// pushModel pushes the audited run's model with --model-ref, its
// attestation naming the zip just written, signed as the zip was.
func (o AuditOptions) pushModel(ctx context.Context, res *AuditResult, out io.Writer) error {
	if o.ModelRef == "" {
		return nil
	}
	if o.PushModel == nil {
		return errors.New("--model-ref: this gpupass was built without the model command")
	}
	var sign [][2]string
	for _, kv := range [][2]string{{"key", o.Key}, {"key-password", string(o.Password)}, {"signing-config", o.SigningConfig}, {"trusted-root", o.TrustedRoot}, {"identity-token", o.IdentityToken}} {
		if kv[1] != "" {
			sign = append(sign, kv)
		}
	}
	errOut := o.ErrOut
	if errOut == nil {
		errOut = io.Discard
	}
	return o.PushModel(ctx, gpupass.ModelPush{AllocationID: res.AllocationID, Ref: o.ModelRef, Audit: res.Path, Broker: o.Broker, Sign: sign}, out, errOut)
}

// auditSummary is the CI step's summary: what was written (wrote, a
// markdown line) and how it was signed; signed keyless, which identity
// signed (repository, workflow, ref, commit, from the certificate) and the
// command that verifies path (a zip, or a group's directory).
func auditSummary(wrote string, simulated bool, sb *audit.SignedBy, path, trustedRoot string) string {
	var b strings.Builder
	b.WriteString("### gpupass audit\n\n" + wrote + "\n")
	if simulated {
		b.WriteString("\n**SIMULATED**: the run used a simulated hardware profile; the report proves nothing about real hardware.\n")
	}
	if sb != nil && sb.Identity != "" {
		b.WriteString("\n| Signed keyless by | |\n|---|---|\n")
		for _, kv := range [][2]string{{"identity", sb.Identity}, {"OIDC issuer", sb.Issuer}, {"repository", sb.Repository}, {"workflow", sb.Workflow}, {"ref", sb.Ref}, {"commit", sb.Commit}} {
			if kv[1] != "" {
				fmt.Fprintf(&b, "| %s | `%s` |\n", kv[0], strings.NewReplacer("|", "\\|", "`", "'", "\n", " ").Replace(kv[1]))
			}
		}
		b.WriteString("\nVerify it with:\n\n```sh\n" + "gpupass audit verify " + termsafe.ShellQuote(path) + keylessflags.VerifyArgs(sb.Identity, sb.Issuer, trustedRoot) + "\n```\n")
	}
	return b.String()
}

// auditOne writes the audit report of one run, o.AllocationID, to o.Out:
// what `gpupass audit ALLOC` does, and for each run of a group.
func (o AuditOptions) auditOne(ctx context.Context) (*AuditResult, error) {
	if o.Out == "" {
		return nil, errors.New("--out is empty: name the zip to write")
	}
	src := o.Source
	switch {
	case src != nil:
	case o.RunFile != "":
		src = audit.FileSource{Path: o.RunFile}
	default:
		src = &BrokerRuns{Broker: &o.Broker}
	}
	res, err := auditrun.Run(ctx, auditrun.Options{
		AllocationID: o.AllocationID, Out: o.Out, Source: src, Key: o.Key, Password: o.Password,
		Keyless: o.Keyless, Attest: o.Attest, TlogUpload: o.TlogUpload, RekorURL: o.RekorURL,
		SigningConfig: o.SigningConfig, TrustedRoot: o.TrustedRoot, IdentityToken: o.IdentityToken,
		Getenv: auditGetenv(o.Getenv), Log: auditLog(o.Log), Group: o.group,
	})
	if errors.Is(err, audit.ErrInProgress) {
		return nil, gpupass.Findings(err)
	}
	return res, err
}

// auditWritten is what `audit` prints: as JSON, the AuditResult.
type auditWritten struct {
	*AuditResult
	// trustedRoot is --trusted-root, named in the verify command printed.
	trustedRoot string
}

func (a auditWritten) WriteText(out io.Writer) error {
	res := a.AuditResult
	var b strings.Builder
	if res.Simulated {
		b.WriteString("!!! SIMULATED: this run used a simulated hardware profile; the report proves nothing about real hardware !!!\n")
	}
	fmt.Fprintf(&b, "wrote %s: %d files, manifest sha256 %s, signed with %s\n", res.Path, res.Files, res.ManifestSHA256, res.Signing)
	switch {
	case res.Uncertified != "":
		fmt.Fprintf(&b, "note: not every rank ran the declared environment (%s); verify will fail that rank's layer\n", res.Uncertified)
	case !res.Match:
		fmt.Fprintf(&b, "note: the measured environment fingerprint differs from the declared one; verify will fail the fingerprint layer\n")
	}
	if res.LogProblem != "" {
		fmt.Fprintf(&b, "note: %s; verify will fail the log layer\n", res.LogProblem)
	}
	if res.SignerIdentity != "" {
		b.WriteString(keylessVerify(res.Path, res.SignerIdentity, res.SignerIssuer, a.trustedRoot))
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// keylessVerify says who signed keyless and the command that verifies
// path (a zip, or a group's directory) against that identity, quoted to
// work pasted.
func keylessVerify(path, identity, issuer, trustedRoot string) string {
	cmd := "gpupass audit verify " + termsafe.ShellQuote(path) + keylessflags.VerifyArgs(identity, issuer, trustedRoot)
	return fmt.Sprintf("signed keyless as %s (OIDC issuer %s); verify with:\n  %s\n", identity, issuer, cmd)
}

// RunAuditVerify verifies an audit report and prints each layer.
func RunAuditVerify(ctx context.Context, o AuditVerifyOptions, out io.Writer) error {
	getenv := auditGetenv(o.Getenv)
	kind, _ := gpupass.CIOutput(o.Output)
	// The section keeps the step's name, as pipelines know it.
	defer ci.New(kind, getenv, o.ErrOut).Group("gpupass audit-verify")()
	identity, err := verifyIdentity(o)
	if err != nil {
		return err
	}
	if o.Key == "" && identity == nil {
		return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("%s is required: the cosign public key (cosign.pub) the report must be signed with; for a report signed keyless, %s (or %s) and %s instead",
			gpupass.CIFlag(o.Output, "key"), gpupass.CIFlag(o.Output, "certificate-identity"), gpupass.CIFlag(o.Output, "certificate-identity-regexp"), gpupass.CIFlag(o.Output, "certificate-oidc-issuer"))}
	}
	var pub crypto.PublicKey
	if o.Key != "" {
		key, done, err := gpupass.KeyFile(gpupass.CIFlag(o.Output, "key"), o.Key)
		if err != nil {
			return err
		}
		defer done()
		if pub, _, err = audit.LoadPublicKey(audit.KeyRef(key), getenv); err != nil {
			return err
		}
	}
	agentKeyFiles := make([]string, 0, len(o.AgentKeys))
	for _, ref := range o.AgentKeys {
		p, done, err := gpupass.KeyFile(gpupass.CIFlag(o.Output, "agent-key"), ref)
		if err != nil {
			return err
		}
		defer done()
		agentKeyFiles = append(agentKeyFiles, p)
	}
	o.AgentKeys = agentKeyFiles
	var agentKeys []audit.AgentKey
	for _, ref := range o.AgentKeys {
		ks, err := loadAgentKeys(ref, getenv)
		if err != nil {
			return err
		}
		agentKeys = append(agentKeys, ks...)
	}
	vopts := audit.VerifyOptions{Key: pub, Identity: identity, AgentKeys: agentKeys, RequirePinned: o.RequirePinned, Fingerprint: declaredFingerprint}
	paths, several, err := verifyPaths(o)
	if err != nil {
		return err
	}
	if !several {
		v, err := verifyOne(ctx, paths[0], o.Extract, vopts)
		if err != nil {
			return err
		}
		if err := output.Write(out, o.Output, v); err != nil {
			return err
		}
		if !v.OK {
			return gpupass.Findings(nil)
		}
		return nil
	}
	set := make(verifiedSet, 0, len(paths))
	for _, p := range paths {
		extract := ""
		if o.Extract != "" {
			// One directory per report, named by its zip.
			extract = filepath.Join(o.Extract, strings.TrimSuffix(filepath.Base(p), ".zip"))
		}
		v, err := verifyOne(ctx, p, extract, vopts)
		if err != nil {
			// An unreadable zip fails its archive layer; the others
			// are still verified and printed.
			v = verified{File: p, Result: &audit.Result{FailedLayer: audit.LayerArchive, Layers: []audit.Layer{{Name: audit.LayerArchive, Status: audit.StatusFail,
				Problems: []audit.Problem{{File: p, Check: "read", Message: err.Error()}}}}}}
		}
		v.inSet = true
		set = append(set, v)
	}
	groupErr := set.checkGroup()
	if err := output.Write(out, o.Output, checkedSet{set, groupErr}); err != nil {
		return err
	}
	if failed := set.failed(); len(failed) > 0 {
		return gpupass.Findings(errors.Join(fmt.Errorf("%d of %d audit reports failed: %s", len(failed), len(set), strings.Join(failed, ", ")), groupErr))
	}
	if groupErr != nil {
		return gpupass.Findings(groupErr)
	}
	return nil
}

// verifyIdentity is the keyless signer the flags name (nil: none), with
// its trusted root loaded.
func verifyIdentity(o AuditVerifyOptions) (*audit.Identity, error) {
	v := keylessflags.Verify{CertIdentity: o.CertIdentity, CertIdentityRegexp: o.CertIdentityRegexp, CertIssuer: o.CertIssuer, CertIssuerRegexp: o.CertIssuerRegexp, TrustedRoot: o.TrustedRoot}
	return v.Identity(func(n string) string { return gpupass.CIFlag(o.Output, n) })
}

// verifyPaths expands what `audit verify` was given: each directory to
// the zips in it, by name. several is false for one zip named alone,
// whose output stays what it always was.
func verifyPaths(o AuditVerifyOptions) (paths []string, several bool, err error) {
	args := o.Paths
	if len(args) == 0 {
		args = []string{o.Path}
	}
	several = len(args) > 1
	for _, a := range args {
		fi, err := os.Stat(a)
		if err != nil || !fi.IsDir() {
			// A missing file fails as it always did, with the others.
			paths = append(paths, a)
			continue
		}
		several = true
		zips, err := filepath.Glob(filepath.Join(a, "*.zip"))
		if err != nil {
			return nil, false, err
		}
		if len(zips) == 0 {
			return nil, false, &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("audit verify: directory %s holds no .zip: name the audit report zips, or the directory gpupass audit GROUP --out wrote", a)}
		}
		paths = append(paths, zips...)
	}
	return paths, several, nil
}

// verifyOne verifies one zip and, unless its archive is broken,
// extracts its files when asked.
func verifyOne(ctx context.Context, path, extract string, vopts audit.VerifyOptions) (verified, error) {
	res, err := audit.VerifyFile(ctx, path, vopts)
	if err != nil {
		return verified{}, err
	}
	extracted := ""
	if extract != "" && res.FailedLayer != audit.LayerArchive {
		zb, err := os.ReadFile(path)
		if err != nil {
			return verified{}, fmt.Errorf("reading audit report: %w", err)
		}
		if _, err := audit.Extract(zb, extract, audit.Limits{}); err != nil {
			return verified{}, err
		}
		extracted = extract
	}
	return verified{File: path, ExtractedTo: extracted, Result: res}, nil
}

// verifiedSet is the reports `audit verify` verified together.
type verifiedSet []verified

// checkedSet is what `audit verify` prints for several reports: each
// report's layers, then which failed and what checkGroup found (groupErr,
// computed once by the caller, which also exits on it); as JSON, a list.
type checkedSet struct {
	verifiedSet
	groupErr error
}

func (c checkedSet) WriteJSON(w io.Writer) error { return output.WriteJSON(w, c.verifiedSet) }

func (s verifiedSet) failed() []string {
	var f []string
	for _, v := range s {
		if !v.OK {
			f = append(f, fmt.Sprintf("%s (layer %s)", v.File, v.FailedLayer))
		}
	}
	return f
}

func (c checkedSet) WriteText(out io.Writer) error {
	s := c.verifiedSet
	for i, v := range s {
		if i > 0 {
			if _, err := io.WriteString(out, "\n"); err != nil {
				return err
			}
		}
		if err := v.WriteText(out); err != nil {
			return err
		}
	}
	var err error
	if failed := s.failed(); len(failed) > 0 {
		_, err = fmt.Fprintf(out, "\n%d of %d audit reports failed: %s\n", len(failed), len(s), strings.Join(failed, ", "))
	} else {
		_, err = fmt.Fprintf(out, "\nverified all %d audit reports\n", len(s))
	}
	if err != nil {
		return err
	}
	return s.writeGroup(out, c.groupErr)
}

// writeGroup says whether the set holds every audited run of the run
// group its reports name (groupErr, what checkGroup returned); nothing
// for reports of no group.
func (s verifiedSet) writeGroup(out io.Writer, groupErr error) error {
	var g *audit.ManifestGroup
	for _, v := range s {
		if v.Result != nil && v.Result.Group != nil {
			g = v.Result.Group
			break
		}
	}
	if g == nil {
		return nil
	}
	if groupErr != nil {
		_, err := fmt.Fprintf(out, "FAIL %v\n", groupErr)
		return err
	}
	audited := 0
	for _, r := range g.Runs {
		if r.Audited {
			audited++
		}
	}
	line := fmt.Sprintf("run group %s: every audited run has its report here (%d of %d runs", g.ID, audited, len(g.Runs))
	if n := len(g.Runs) - audited; n > 0 {
		line += fmt.Sprintf("; %d ended before it started and has none", n)
	}
	_, err := fmt.Fprintf(out, "%s)\n", line)
	return err
}

// verified is what `audit verify` prints.
type verified struct {
	File        string `json:"file"`
	ExtractedTo string `json:"extracted_to,omitempty"`
	*audit.Result
	// inSet: verified with the rest of its set, which checks the group.
	inSet bool
}

func (v verified) WriteText(out io.Writer) error {
	res := v.Result
	var b strings.Builder
	if res.Simulated {
		b.WriteString("!!! SIMULATED: this report describes a run on a simulated hardware profile !!!\n")
	}
	for _, l := range res.Layers {
		fmt.Fprintf(&b, "%s %-16s %s\n", layerStatus[l.Status], l.Name, l.Detail)
		for _, p := range l.Problems {
			fmt.Fprintf(&b, "     %s [%s]: %s\n", p.File, p.Check, p.Message)
		}
	}
	if v.ExtractedTo != "" {
		fmt.Fprintf(&b, "extracted the report's files into %s\n", v.ExtractedTo)
	}
	switch {
	case res.OK && len(res.Warnings) > 0:
		fmt.Fprintf(&b, "verified %s (allocation %s) with warnings: %s\n", v.File, res.AllocationID, strings.Join(res.Warnings, "; "))
	case res.OK:
		fmt.Fprintf(&b, "verified %s (allocation %s)\n", v.File, res.AllocationID)
	default:
		fmt.Fprintf(&b, "verification of %s failed at layer %s\n", v.File, res.FailedLayer)
	}
	if res.Group != nil && !v.inSet {
		fmt.Fprintf(&b, "one of the %d runs of run group %s: verify the directory of its reports to check the whole group\n", len(res.Group.Runs), res.Group.ID)
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// layerStatus is how the text output shows a layer's status: four
// columns, so that the names line up.
var layerStatus = map[string]string{
	audit.StatusOK: "ok  ", audit.StatusWarn: "warn", audit.StatusFail: "FAIL", audit.StatusSkipped: "skip",
}

// loadAgentKeys reads --agent-key: a PEM public key, or a JSON list of
// keys with validity windows (what the broker's node registry exports).
func loadAgentKeys(ref string, getenv func(string) string) ([]audit.AgentKey, error) {
	var b []byte
	if v, ok := strings.CutPrefix(ref, "env://"); ok {
		b = []byte(getenv(v))
	} else {
		var err error
		if b, err = os.ReadFile(ref); err != nil {
			return nil, fmt.Errorf("reading --agent-key: %w", err)
		}
	}
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '[' {
		var list []struct {
			PEM       string    `json:"pem"`
			NotBefore time.Time `json:"not_before"`
			NotAfter  time.Time `json:"not_after"`
		}
		if err := json.Unmarshal(t, &list); err != nil {
			return nil, fmt.Errorf("--agent-key %s: parsing key list: %w (want [{\"pem\":…,\"not_before\":…,\"not_after\":…}])", ref, err)
		}
		// An empty list pins nothing: verification would fall back to
		// the key inside the report, which is what --agent-key is for
		// refusing.
		if len(list) == 0 {
			return nil, fmt.Errorf("--agent-key %s: the key list is empty: export the agents' keys from the broker's node registry, or leave out --agent-key to trust the key inside the report", ref)
		}
		var ks []audit.AgentKey
		for i, k := range list {
			if _, err := conformance.ParsePublicKey([]byte(k.PEM)); err != nil {
				return nil, fmt.Errorf("--agent-key %s: entry %d: %w", ref, i, err)
			}
			ks = append(ks, audit.AgentKey{PEM: []byte(k.PEM), NotBefore: k.NotBefore, NotAfter: k.NotAfter})
		}
		return ks, nil
	}
	if _, _, err := audit.LoadPublicKey(audit.KeyRef(ref), getenv); err != nil {
		return nil, fmt.Errorf("--agent-key: %w", err)
	}
	return []audit.AgentKey{{PEM: b}}, nil
}

// RunAuditKeygen writes a cosign-compatible key pair.
func RunAuditKeygen(_ context.Context, o AuditKeygenOptions, out io.Writer) error {
	getenv, log := auditGetenv(o.Getenv), auditLog(o.Log)
	pw := getenv(audit.PasswordEnv)
	if pw == "" {
		log.Warn("COSIGN_PASSWORD is empty: the private key is encrypted with an empty password")
	}
	keyPath, pubPath, err := audit.WriteKeyPair(o.Prefix, []byte(pw), o.Force)
	if err != nil {
		return err
	}
	return output.Write(out, o.Output, keyPair{PrivateKey: keyPath, PublicKey: pubPath})
}

// keyPair is what `audit keygen` prints.
type keyPair struct {
	PrivateKey string `json:"private_key"`
	PublicKey  string `json:"public_key"`
}

func (k keyPair) WriteText(out io.Writer) error {
	_, err := fmt.Fprintf(out, "wrote %s (private, mode 0600) and %s (public)\n", k.PrivateKey, k.PublicKey)
	return err
}
