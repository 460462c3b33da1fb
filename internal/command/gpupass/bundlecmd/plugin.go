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

// CIStep runs the bundle-push or bundle-pull CI step (o.Command): the
// real command with the CI output format of env.
func (Plugin) CIStep(ctx context.Context, o *gpupass.CIStepOptions, env *ci.Env, out io.Writer) error {
	output := string(env.Kind())
	if env.Kind() == ci.None {
		output = "text"
	}
	reg, err := ciRegistry(o)
	if err != nil {
		return err
	}
	g := &gpupass.GlobalOptions{Output: output}
	switch o.Command {
	case "bundle-push":
		return RunBundlePush(ctx, &BundlePushOptions{Global: g, RegistryFlags: reg, TargetFlags: TargetFlags{Spec: o.Spec, Arch: defaultArch, GLIBC: defaultGLIBC},
			PushOptions: appbundle.PushOptions{Wheelhouse: o.Wheelhouse, Progress: o.ErrOut, Getenv: o.Getenv, Logger: o.Logger}}, o.RegistryRef, out)
	case "bundle-pull":
		return RunBundlePull(ctx, &BundlePullOptions{Global: g, RegistryFlags: reg, Getenv: o.Getenv,
			PullOptions: appbundle.PullOptions{To: o.Wheelhouse, Progress: o.ErrOut, Logger: o.Logger}}, o.RegistryRef, out)
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
