package gpupass

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/validate"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/nodeview"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// NodesOptions are the flags of `gpupass nodes`.
type NodesOptions struct {
	Global  *GlobalOptions
	Broker  BrokerFlags
	Regions []string
	// OnlineOnly hides offline nodes.
	OnlineOnly bool
	// SpecFingerprint keeps the nodes certified for that spec.
	SpecFingerprint string
}

// AddFlags registers nodes' flags.
func (o *NodesOptions) AddFlags(cmd *cobra.Command) {
	o.Broker.AddFlags(cmd)
	f := cmd.Flags()
	f.StringSliceVar(&o.Regions, "region", nil, "only these regions (glob patterns; repeatable or comma-separated)")
	f.BoolVar(&o.OnlineOnly, "online", false, "hide offline nodes")
	f.StringVar(&o.SpecFingerprint, "spec-fingerprint", "", "only nodes certified for this spec (sha256:…, as gpupass validate prints it; the broker must know the spec from a dry run or a run)")
}

func newNodesCmd(g *GlobalOptions) *cobra.Command {
	o := &NodesOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List certified nodes with their health score and its terms",
		Long: `List the broker's certified nodes in the token's region scope, ordered by
health score: score = min(100, 100 - 0.1*latency_ms - 5*failure_rate_pct_24h
- 2*price_premium_pct), with each term shown.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return RunNodes(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	cmd.AddCommand(
		newNodesAdmitCmd(g, "approve", "Admit nodes pending admission, so they may take runs (admin token)",
			`Approve nodes where the broker admits nodes by approval (gpupass-broker serve
--admission 'eu-*=approve'): an approved node takes runs in the region it is
enrolled in now; enrolled into another region, it is pending again. The
decision is stored and shared by every broker replica. Needs an admin token
whose scope covers the node's region.`),
		newNodesAdmitCmd(g, "deny", "Deny nodes admission: they take no runs until approved (admin token)",
			`Deny nodes admission, in any region: a denied node stays listed, with the
reason, and takes no runs until an admin approves it. Runs it holds now are
not stopped (gpupass cancel does that). Needs an admin token whose scope
covers the node's region.`))
	return cmd
}

// RunNodes lists nodes.
func RunNodes(ctx context.Context, o *NodesOptions, out io.Writer) error {
	c, err := o.Broker.Dial()
	if err != nil {
		return err
	}
	resp, err := c.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{Regions: o.Regions, IncludeOffline: !o.OnlineOnly,
		SpecFingerprint: o.SpecFingerprint}))
	if err != nil {
		if o.SpecFingerprint != "" && connect.CodeOf(err) == connect.CodeFailedPrecondition {
			// The broker knows specs from dry runs and runs; the CLI
			// names its own command that makes one known.
			return fmt.Errorf("%w; %s", rpcError("listing nodes", o.Broker.URL, err), knownSpecHint(ctx, o.SpecFingerprint))
		}
		if o.SpecFingerprint != "" && connect.CodeOf(err) == connect.CodeInvalidArgument {
			return fmt.Errorf("%w; gpupass validate prints a spec's fingerprint", rpcError("listing nodes", o.Broker.URL, err))
		}
		return rpcError("listing nodes", o.Broker.URL, err)
	}
	return output.Write(out, o.Global.format(), nodeList{List: nodeview.ListOf(resp.Msg.Nodes), nodes: resp.Msg.Nodes, spec: o.SpecFingerprint})
}

// nodeList is what `nodes` prints: as JSON, nodeview's document.
type nodeList struct {
	nodeview.List
	nodes []*gpupassv1.Node
	spec  string // --spec-fingerprint
}

func (l nodeList) WriteText(out io.Writer) error {
	if len(l.nodes) == 0 {
		msg := "no nodes in scope"
		if l.spec != "" {
			msg = "no node in scope is certified for spec " + l.spec
		}
		_, err := fmt.Fprintln(out, msg)
		return err
	}
	return writeNodeTable(out, l.nodes)
}

// knownSpecHint says how to make the spec of fingerprint fp known to the
// broker: the dry run of the project's spec file when that is the spec
// (a command that runs as printed here), else in words, for a spec file
// this command cannot name.
func knownSpecHint(ctx context.Context, fp string) string {
	files := slices.Clone(validate.SpecFileNames)
	if above := validate.SpecAbove("."); above != "" {
		files = append(files, above)
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			continue
		}
		if res, err := validate.Run(ctx, validate.Options{Spec: f}); err == nil && res.Fingerprint == fp {
			return "gpupass validate --dry-run --spec " + termsafe.ShellQuote(f) + " makes it known"
		}
	}
	return "a dry run of the spec file with that fingerprint (gpupass validate's --dry-run) or a run of it makes it known"
}
