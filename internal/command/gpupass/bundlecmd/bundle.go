// Package bundlecmd holds the bundle commands: `gpupass bundle push`,
// `pull`, `inspect` and `verify`, and the bundle-push and bundle-pull CI
// steps. They link the OCI registry client (go-containerregistry, docker's
// credential config); cmd/gpupass links them in (Command).
package bundlecmd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	appbundle "github.com/gpupass/gpupass/internal/app/bundle"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/flagalias"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/command/registryflags"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// RegistryFlags are the transport and auth flags every bundle command
// shares: the one registry flag set gpupass-agent registers too
// (registryflags: --plain-http, --registry-username/-password/-timeout),
// and how many blobs move at once. Credentials come from those flags
// (GPUPASS_REGISTRY_USERNAME/PASSWORD, or *_FILE), else from the docker
// config (~/.docker/config.json and its credential helpers).
type RegistryFlags struct {
	registryflags.Flags
	Jobs int
}

// AddFlags registers the registry flags.
func (o *RegistryFlags) AddFlags(cmd *cobra.Command) {
	o.Flags.AddFlags(cmd.Flags())
	cmd.Flags().IntVarP(&o.Jobs, "jobs", "j", 4, "blobs moved in parallel")
}

// noTimeout hides --registry-timeout where it has no effect (push and
// inspect: only a pull's requests are bounded by it), so no help text
// describes another command. It stays accepted, with a note, for scripts
// that pass it to every bundle command.
func noTimeout(cmd *cobra.Command) {
	_ = cmd.Flags().MarkDeprecated("registry-timeout", "it bounds a pull's waits; `gpupass bundle "+cmd.Name()+"` ignores it")
}

func (o *RegistryFlags) options() (bundle.RegistryOptions, error) {
	if o.Jobs < 1 || o.Jobs > 64 {
		return bundle.RegistryOptions{}, fielderr.New("jobs", fmt.Sprint(o.Jobs), "want 1 to 64")
	}
	r := o.Flags.Options(buildinfo.UserAgent("gpupass"))
	r.Jobs = o.Jobs
	if err := r.Validate(); err != nil {
		return bundle.RegistryOptions{}, err
	}
	return r, nil
}

// The nodes' platform when no flag or input names one.
const (
	defaultArch  = appbundle.DefaultArch
	defaultGLIBC = appbundle.DefaultGLIBC
)

// TargetFlags say which interpreter and platform the wheels must fit.
type TargetFlags struct {
	Spec            string
	Python          string
	Arch            string
	GLIBC           string
	AllowIncomplete bool
}

// AddFlags registers the coverage flags.
func (o *TargetFlags) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVarP(&o.Spec, "spec", "s", "", "spec file whose pinned packages the wheelhouse must cover")
	flagalias.Shorthand(f, "spec", "f", cmd.ErrOrStderr) // -f is --follow elsewhere
	f.StringVar(&o.Python, "python", "", "target CPython version (default: the spec's runtime.python)")
	f.StringVar(&o.Arch, "arch", defaultArch, "target architecture of the nodes (x86_64, aarch64)")
	f.StringVar(&o.GLIBC, "glibc", defaultGLIBC, "glibc version of the nodes: manylinux wheels newer than this are incompatible")
	f.BoolVar(&o.AllowIncomplete, "allow-incomplete", false, "push even when the wheelhouse does not cover every pinned package")
}

// target is the use case's Target the flags name.
func (o *TargetFlags) target() appbundle.Target {
	return appbundle.Target{Spec: o.Spec, Python: o.Python, Arch: o.Arch, GLIBC: o.GLIBC, AllowIncomplete: o.AllowIncomplete}
}

// bundleFlagNames maps the use cases' option fields to the flags.
var bundleFlagNames = fielderr.Names{"Wheelhouse": "--wheelhouse", "To": "--to", "Python": "--python"}

// bundleCLIError names the flags in a bundle use case's error (with a
// CI output format, as flag, variable and input).
func bundleCLIError(err error, format output.Format) error {
	var ie *appbundle.IncompleteError
	if errors.As(err, &ie) {
		return gpupass.Findings(fmt.Errorf("%w (--allow-incomplete pushes anyway)", ie))
	}
	names := fielderr.Names{}
	for field, flag := range bundleFlagNames {
		names[field] = gpupass.CIFlag(format, strings.TrimPrefix(flag, "--"))
	}
	return names.Apply(err)
}

func newBundleCmd(g *gpupass.GlobalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Move wheelhouses in and out of OCI registries, verified, for nodes without internet",
		Long: `A bundle is an OCI 1.1 artifact holding a wheelhouse: one layer per wheel,
a lock layer (name, version, tags, sha256 of each wheel) and the spec's
fingerprint. Nodes without internet pull it by digest and install with
pip --no-index.`,
	}
	cmd.AddCommand(newBundlePushCmd(g), newBundlePullCmd(g), newBundleInspectCmd(g), newBundleVerifyCmd(g))
	return cmd
}

// BundlePushOptions are the flags of `gpupass bundle push`.
type BundlePushOptions struct {
	// PushOptions are the use case's: the flags fill them, and Ref,
	// Registry and Target are set from the argument and the flag groups
	// below when the command runs.
	appbundle.PushOptions
	Global        *gpupass.GlobalOptions
	RegistryFlags RegistryFlags
	TargetFlags   TargetFlags
	// Ref is --ref, the REF argument's flag (a pipeline's registry-ref).
	Ref string
}

// AddFlags registers push's flags.
func (o *BundlePushOptions) AddFlags(cmd *cobra.Command) {
	o.RegistryFlags.AddFlags(cmd)
	noTimeout(cmd)
	o.TargetFlags.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVarP(&o.Wheelhouse, "wheelhouse", "w", "", "directory of .whl files to push (required)")
	f.StringVar(&o.MountFrom, "mount-from", "", "repository on the same registry to mount existing blobs from (REGISTRY/REPO)")
	f.BoolVar(&o.NoCache, "no-cache", false, "re-read every wheel instead of trusting the scan cache for files unchanged since they last passed")
	f.StringVar(&o.Source, "source", "", "source repository URL for the org.opencontainers.image.source annotation (default: from CI variables)")
	f.StringVar(&o.Ref, "ref", "", "OCI reference to push to, instead of the REF argument")
}

// refArg is the REF argument, or --ref; a usage error when both differ.
func refArg(args []string, flag string) (string, error) {
	switch {
	case len(args) == 0:
		return flag, nil
	case flag != "" && flag != args[0]:
		return "", &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("reference %s and --ref %s: name it once", args[0], flag)}
	}
	return args[0], nil
}

// missing is a usage error naming every (flag, value) pair left empty, as
// flag, variable and input with a CI output format (a pipeline step's
// inputs are named at once). Outside CI only REF is checked here: the use
// case names its own required fields.
func missing(format output.Format, command string, pairs ...string) error {
	if _, isCI := gpupass.CIOutput(format); !isCI {
		if pairs[1] == "" {
			return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("%s needs REF, the bundle's reference (or --ref)", command)}
		}
		return nil
	}
	var names []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if strings.TrimSpace(pairs[i+1]) == "" {
			names = append(names, gpupass.CIFlag(format, pairs[i]))
		}
	}
	if len(names) == 0 {
		return nil
	}
	return &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("%s: missing %s", command, strings.Join(names, ", "))}
}

func newBundlePushCmd(g *gpupass.GlobalOptions) *cobra.Command {
	o := &BundlePushOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "push --wheelhouse DIR [--spec gpupass.yaml] REF|--ref REF",
		Short: "Push a wheelhouse as a bundle and print its digest",
		Long: `Check every wheel (name, zip, RECORD hashes), check that the wheelhouse covers
every pinned package of the spec for its python and the nodes' platform, then
upload: blobs in parallel, those the registry already has skipped, the tag last.

Prints REF@sha256:... (with --output json, everything).
Exit codes: 0 pushed, 1 wheelhouse problems or incomplete coverage, 2 usage,
I/O or registry error.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := refArg(args, o.Ref)
			if err != nil {
				return err
			}
			o.Progress = cmd.ErrOrStderr()
			o.TTY = gpupass.IsTerminal(o.Progress)
			o.Getenv = os.Getenv
			o.Logger = g.Logger(cmd.ErrOrStderr())
			return RunBundlePush(cmd.Context(), o, ref, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	return gpupass.CICommand(cmd)
}

// RunBundlePush runs `gpupass bundle push`. With a CI output format
// (the bundle-push step) it also hands on the bundle-digest output and
// writes the job summary.
func RunBundlePush(ctx context.Context, o *BundlePushOptions, ref string, out io.Writer) error {
	kind, isCI := gpupass.CIOutput(o.Global.Output)
	env := ci.New(kind, o.Getenv, o.Progress)
	// The section keeps the step's name, as pipelines know it.
	defer env.Group("gpupass bundle-push")()
	if err := missing(o.Global.Output, "bundle push", "ref", ref, "wheelhouse", o.Wheelhouse); err != nil {
		return err
	}
	res, err := bundlePush(ctx, o, ref)
	if err != nil {
		return bundleCLIError(err, o.Global.Output)
	}
	if err := output.Write(out, o.Global.Output, pushed{res}); err != nil || !isCI {
		return err
	}
	if err := env.SetOutput("bundle-digest", res.Digest); err != nil {
		return err
	}
	return env.Summary(fmt.Sprintf("### gpupass bundle push\n\nPushed `%s`\n", res.Reference))
}

// pushed is what `bundle push` prints: the reference, or as JSON the
// PushResult.
type pushed struct{ *appbundle.PushResult }

func (p pushed) WriteText(w io.Writer) error { return appbundle.RenderPush(w, p.PushResult, false) }

// bundlePush runs the push use case with the flags.
func bundlePush(ctx context.Context, o *BundlePushOptions, ref string) (*appbundle.PushResult, error) {
	ropts, err := o.RegistryFlags.options()
	if err != nil {
		return nil, err
	}
	opts := o.PushOptions
	opts.Ref, opts.Registry, opts.Target = ref, ropts, o.TargetFlags.target()
	return appbundle.Push(ctx, opts)
}

// BundlePullOptions are the flags of `gpupass bundle pull`.
type BundlePullOptions struct {
	// PullOptions are the use case's: the flags fill them, and Ref and
	// Registry are set from the argument and RegistryFlags when the
	// command runs.
	appbundle.PullOptions
	Global        *gpupass.GlobalOptions
	RegistryFlags RegistryFlags
	// Ref is --ref, the REF argument's flag (a pipeline's registry-ref).
	Ref string
	// Getenv reads the CI variables (-o github|gitlab); nil: none.
	Getenv func(string) string
}

// AddFlags registers pull's flags.
func (o *BundlePullOptions) AddFlags(cmd *cobra.Command) {
	o.RegistryFlags.AddFlags(cmd)
	cmd.Flags().StringVar(&o.Ref, "ref", "", "OCI reference to pull, instead of the REF argument")
	cmd.Flags().StringVar(&o.To, "to", "", "directory to write the wheelhouse to; must not exist or be empty (required)")
	cmd.Flags().BoolVar(&o.Fsync, "fsync", false, "fsync every wheel before the wheelhouse is moved into place (survives power loss; slower)")
	cmd.Flags().BoolVar(&o.VerifyRecord, "verify-record", false, "also re-check every wheel's zip and RECORD hashes, as push did (always done for artifacts without a gpupass lock layer; inflates every deflated file)")
}

func newBundlePullCmd(g *gpupass.GlobalOptions) *cobra.Command {
	o := &BundlePullOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "pull REF|--ref REF --to DIR",
		Short: "Pull a bundle into a verified wheelhouse",
		Long: `Fetch a bundle by tag or digest, check every blob's digest and the lock
layer, refuse unsafe file names, and move the wheelhouse into place only when
everything checked out. Each wheel's RECORD hashes, which push checked, are
checked again for artifacts without a gpupass lock layer, or with
--verify-record. Then:
  pip install --no-index --find-links DIR <pkg>==<version>

Exit codes: 0 pulled, 1 verification failed, 2 usage, I/O or registry error.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := refArg(args, o.Ref)
			if err != nil {
				return err
			}
			o.Progress = cmd.ErrOrStderr()
			o.TTY = gpupass.IsTerminal(o.Progress)
			o.Getenv = os.Getenv
			o.Logger = g.Logger(cmd.ErrOrStderr())
			return RunBundlePull(cmd.Context(), o, ref, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	return gpupass.CICommand(cmd)
}

// RunBundlePull runs `gpupass bundle pull`.
func RunBundlePull(ctx context.Context, o *BundlePullOptions, ref string, out io.Writer) error {
	kind, _ := gpupass.CIOutput(o.Global.Output)
	// The section keeps the step's name, as pipelines know it.
	defer ci.New(kind, o.Getenv, o.Progress).Group("gpupass bundle-pull")()
	if err := missing(o.Global.Output, "bundle pull", "ref", ref, "to", o.To); err != nil {
		return err
	}
	ropts, err := o.RegistryFlags.options()
	if err != nil {
		return err
	}
	opts := o.PullOptions
	opts.Ref, opts.Registry = ref, ropts
	res, err := appbundle.Pull(ctx, opts)
	if err != nil {
		return bundleCLIError(err, o.Global.Output)
	}
	return output.Write(out, o.Global.Output, pulled{res})
}

// pulled is what `bundle pull` prints.
type pulled struct{ *bundle.PullResult }

func (p pulled) WriteText(w io.Writer) error { return appbundle.RenderPull(w, p.PullResult, false) }

// BundleInspectOptions are the flags of `gpupass bundle inspect`.
type BundleInspectOptions struct {
	Global   *gpupass.GlobalOptions
	Registry RegistryFlags
}

func newBundleInspectCmd(g *gpupass.GlobalOptions) *cobra.Command {
	o := &BundleInspectOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "inspect REF",
		Short: "List a bundle's wheels and annotations without pulling them",
		Long: `List a bundle's wheels, lock and annotations without pulling them, and
the artifacts attached to it (signatures, SBOMs, attestations): through the
registry's referrers API, or the sha256-<hex> tag on a registry without it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return RunBundleInspect(cmd.Context(), o, args[0], cmd.OutOrStdout())
		},
	}
	o.Registry.AddFlags(cmd)
	noTimeout(cmd)
	return cmd
}

// RunBundleInspect runs `gpupass bundle inspect`.
func RunBundleInspect(ctx context.Context, o *BundleInspectOptions, ref string, out io.Writer) error {
	ropts, err := o.Registry.options()
	if err != nil {
		return err
	}
	info, err := bundle.Inspect(ctx, ref, bundle.PullOptions{Registry: ropts})
	if err != nil {
		return err
	}
	return output.Write(out, o.Global.Output, inspected(info))
}

// inspected is what `bundle inspect` prints.
type inspected bundle.Info

func (i inspected) WriteText(out io.Writer) error {
	info := bundle.Info(i)
	fmt.Fprintf(out, "%s\nartifactType: %s\n", info.Reference, info.ArtifactType)
	for _, k := range []string{bundle.AnnotationCreated, bundle.AnnotationSource, bundle.AnnotationFingerprint, bundle.AnnotationPython} {
		if v := info.Annotations[k]; v != "" {
			fmt.Fprintf(out, "%s: %s\n", k, v)
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FILE\tSIZE\tDIGEST")
	for _, l := range info.Layers {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", l.Title, l.Size, l.Digest)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case info.ReferrersError != "":
		fmt.Fprintf(out, "referrers: %s\n", info.ReferrersError)
	case len(info.Referrers) == 0:
		fmt.Fprintln(out, "referrers: none")
	default:
		fmt.Fprintln(out, "referrers:")
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ARTIFACT TYPE\tSIZE\tDIGEST")
		for _, r := range info.Referrers {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", cmp.Or(r.ArtifactType, r.MediaType), r.Size, r.Digest)
		}
		return tw.Flush()
	}
	return nil
}

// BundleVerifyOptions are the flags of `gpupass bundle verify`.
type BundleVerifyOptions struct {
	Global *gpupass.GlobalOptions
	Target TargetFlags
	Jobs   int
}

func newBundleVerifyCmd(g *gpupass.GlobalOptions) *cobra.Command {
	o := &BundleVerifyOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "verify DIR [--spec gpupass.yaml]",
		Short: "Check a wheelhouse: valid wheels, RECORD hashes, and coverage of the spec",
		Long: `Check every wheel of DIR (name, zip, RECORD hashes, duplicates) and, with
--spec, that every pinned package has a wheel that installs on the spec's
python and the nodes' platform.

Exit codes: 0 ok, 1 problems found, 2 usage or I/O error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return RunBundleVerify(cmd.Context(), o, args[0], cmd.OutOrStdout())
		},
	}
	o.Target.AddFlags(cmd)
	// verify pushes nothing: here the flag only lets gaps pass.
	cmd.Flags().Lookup("allow-incomplete").Usage = "exit 0 when the wheelhouse does not cover every pinned package (the gaps are still listed)"
	cmd.Flags().IntVarP(&o.Jobs, "jobs", "j", 4, "wheels checked in parallel")
	return cmd
}

// RunBundleVerify runs `gpupass bundle verify`.
func RunBundleVerify(ctx context.Context, o *BundleVerifyOptions, dir string, out io.Writer) error {
	res, err := appbundle.Verify(ctx, appbundle.VerifyOptions{Dir: dir, Target: o.Target.target(), Jobs: o.Jobs})
	if err != nil {
		return bundleCLIError(err, o.Global.Output)
	}
	if err := output.Write(out, o.Global.Output, verified{res}); err != nil {
		return err
	}
	return res.Err()
}

// verified is what `bundle verify` prints.
type verified struct{ *appbundle.VerifyResult }

func (v verified) WriteText(w io.Writer) error {
	return appbundle.RenderVerify(w, v.VerifyResult, false, "--allow-incomplete")
}
