package bundlecmd

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	appbundle "github.com/gpupass/gpupass/internal/app/bundle"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/registryflags"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// Plugin is the gpupass.Plugin with the bundle commands linked in.
type Plugin struct{}

var _ gpupass.Plugin = Plugin{}

// Command returns the `bundle` command tree.
func (Plugin) Command(g *gpupass.GlobalOptions) *cobra.Command { return newBundleCmd(g) }

// FieldNames rename the registry library's fields to the bundle
// commands' flags and to what the CI steps read them from.
func (Plugin) FieldNames() (flags, inputs fielderr.Names) {
	return fielderr.Names{
			bundle.FieldMountFrom: "--mount-from",
			bundle.FieldUsername:  "--registry-username",
			bundle.FieldPassword:  "--registry-password",
			bundle.FieldPlainHTTP: "--plain-http (GPUPASS_PLAIN_HTTP=true)",
			"jobs":                "--jobs",
		}, fielderr.Names{
			bundle.FieldMountFrom: "mount source",
			bundle.FieldUsername:  "GPUPASS_REGISTRY_USERNAME",
			bundle.FieldPassword:  "GPUPASS_REGISTRY_PASSWORD",
			bundle.FieldPlainHTTP: "GPUPASS_PLAIN_HTTP=true",
		}
}

// CIStep runs the bundle-push or bundle-pull CI step (o.Command).
func (Plugin) CIStep(ctx context.Context, o *gpupass.CIStepOptions, env *ci.Env, out io.Writer) error {
	end := env.Group("gpupass " + o.Command)
	defer end()
	switch o.Command {
	case "bundle-push":
		return ciBundlePush(ctx, o, env, out)
	case "bundle-pull":
		return ciBundlePull(ctx, o, out)
	}
	return fmt.Errorf("step %s: not a bundle step", o.Command)
}

// ciRegistry is what the bundle commands' registry flags would hold: the
// plain-http input, the default parallelism and timeout, and credentials
// from GPUPASS_REGISTRY_USERNAME/PASSWORD (or *_FILE) or the docker config.
func ciRegistry(o *gpupass.CIStepOptions) (RegistryFlags, error) {
	r := RegistryFlags{Flags: registryflags.Flags{PlainHTTP: o.PlainHTTP, Timeout: bundle.DefaultTimeout, Username: o.Getenv(gpupass.EnvName("registry-username"))}, Jobs: 4}
	r.Password = o.Getenv(gpupass.EnvName("registry-password"))
	if f := o.Getenv(gpupass.EnvName("registry-password") + "_FILE"); r.Password == "" && f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return r, fmt.Errorf("reading %s_FILE: %w", gpupass.EnvName("registry-password"), err)
		}
		r.Password = strings.TrimRight(string(b), "\r\n")
	}
	return r, nil
}

func ciBundlePush(ctx context.Context, o *gpupass.CIStepOptions, env *ci.Env, out io.Writer) error {
	if err := o.Require("registry-ref", o.RegistryRef, "wheelhouse", o.Wheelhouse); err != nil {
		return err
	}
	reg, err := ciRegistry(o)
	if err != nil {
		return err
	}
	p := &BundlePushOptions{
		Global: &gpupass.GlobalOptions{Output: "json"}, RegistryFlags: reg, TargetFlags: TargetFlags{Spec: o.Spec, Arch: defaultArch, GLIBC: defaultGLIBC},
		PushOptions: appbundle.PushOptions{Wheelhouse: o.Wheelhouse, Progress: o.ErrOut, Getenv: o.Getenv, Logger: o.Logger},
	}
	res, err := bundlePush(ctx, p, o.RegistryRef)
	if err != nil {
		return ciBundleInputs.Apply(err)
	}
	if err := gpupass.WriteJSON(out, res); err != nil {
		return err
	}
	if err := env.SetOutput("bundle-digest", res.Digest); err != nil {
		return err
	}
	return env.Summary(fmt.Sprintf("### gpupass bundle push\n\nPushed `%s`\n", res.Reference))
}

func ciBundlePull(ctx context.Context, o *gpupass.CIStepOptions, out io.Writer) error {
	if err := o.Require("registry-ref", o.RegistryRef, "wheelhouse", o.Wheelhouse); err != nil {
		return err
	}
	reg, err := ciRegistry(o)
	if err != nil {
		return err
	}
	ropts, err := reg.options()
	if err != nil {
		return err
	}
	res, err := appbundle.Pull(ctx, appbundle.PullOptions{Ref: o.RegistryRef, To: o.Wheelhouse, Registry: ropts, Progress: o.ErrOut, Logger: o.Logger})
	if err != nil {
		return ciBundleInputs.Apply(err)
	}
	return appbundle.RenderPull(out, res, false)
}

// ciBundleInputs maps the bundle use cases' option fields to the inputs.
var ciBundleInputs = fielderr.Names{"Wheelhouse": "input wheelhouse", "To": "input wheelhouse", "Python": "input spec"}
