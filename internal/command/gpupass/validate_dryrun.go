package gpupass

import (
	"context"
	"fmt"
	"io"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// DryRunOptions are validate's --dry-run flags: ask the broker which
// certified nodes can run the spec.
type DryRunOptions struct {
	Enabled        bool
	Broker         BrokerFlags
	Regions        []string
	MinHealthScore float64
	MaxPrice       float64
	// Excluded is "all" (excluded nodes with their reasons) or
	// "summary" (how many nodes each reason excludes).
	Excluded string
	// Limit caps the candidates and the excluded nodes listed (0: the
	// broker's default, api.DefaultDryRunLimit); All lists every one.
	Limit int32
	All   bool
}

// AddFlags registers the dry-run flags.
func (o *DryRunOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&o.Enabled, "dry-run", false, "ask the broker which certified nodes match, with health scores and why others are excluded")
	o.Broker.AddFlags(cmd)
	f.StringSliceVar(&o.Regions, "region", nil, "dry-run: only these regions (glob patterns; repeatable)")
	f.Float64Var(&o.MinHealthScore, "min-health-score", api.DefaultMinHealthScore, "dry-run: exclude nodes scoring below this")
	f.Float64Var(&o.MaxPrice, "max-price", 0, "dry-run: exclude nodes above this price per hour (0: no limit)")
	f.StringVar(&o.Excluded, "excluded", "all", "dry-run: all (excluded nodes with their reasons, up to --limit) or summary (node counts per reason)")
	f.Int32Var(&o.Limit, "limit", api.DefaultDryRunLimit, "dry-run: list at most this many candidates (the best) and excluded nodes (nearest misses first); every node is still counted")
	f.BoolVar(&o.All, "all", false, "dry-run: list every candidate and every excluded node, whatever --limit says")
}

// run sends the spec file as written: the broker validates it with the
// same rules and matches it against its registry.
func (o *DryRunOptions) run(ctx context.Context, specBytes []byte) (*gpupassv1.DryRunResponse, error) {
	// The columns view is the cheapest to send and decode at 10,000
	// nodes; it is expanded here, so the output is the inline layout.
	view := gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS
	switch o.Excluded {
	case "all", "":
	case "summary":
		view = gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY
	default:
		return nil, &ExitError{Code: ExitUsage, Err: fmt.Errorf("--excluded %q: use all or summary", o.Excluded)}
	}
	if o.Limit < 1 && !o.All {
		return nil, &ExitError{Code: ExitUsage, Err: fmt.Errorf("--limit %d: want 1 or more, or --all for every node", o.Limit)}
	}
	c, err := o.Broker.Dial()
	if err != nil {
		return nil, err
	}
	min := o.MinHealthScore
	resp, err := c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{
		Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specBytes}, Regions: o.Regions, MinHealthScore: &min, MaxPrice: o.MaxPrice,
		View: view, DeriveScoreTerms: true, Limit: o.Limit, All: o.All,
	}))
	if err != nil {
		return nil, rpcError("dry-run", o.Broker.URL, err)
	}
	if err := api.ExpandDryRun(resp.Msg); err != nil {
		return nil, fmt.Errorf("reading the dry-run answer of %s: %w", o.Broker.URL, err)
	}
	return resp.Msg, nil
}

// writeDryRunText prints candidates by score with each term, then the
// excluded nodes with their reasons, then, when not every excluded node
// is listed, how many nodes each reason excludes with a few examples. It
// says how many nodes each list left out and how to see them.
func writeDryRunText(out io.Writer, url string, m *gpupassv1.DryRunResponse) error {
	// A broker from before candidates_total lists every candidate.
	candidates := max(int(m.CandidatesTotal), len(m.Candidates))
	excluded := max(int(m.ExcludedTotal), len(m.Excluded))
	fmt.Fprintf(out, "\ndry-run at %s: %d candidate(s), %d excluded (min health score %s)\n", url, candidates, excluded, f2(m.MinHealthScore))
	if candidates == 0 && excluded == 0 {
		// An empty registry is a newcomer's first dry-run, not a spec
		// problem: say how to get a node.
		fmt.Fprintf(out, "no node is enrolled at %s (in the regions asked for): start an agent with an agent token (gpupass-agent --broker-url %s, add --simulate h100-sxm5-8x without a GPU), or run `gpupass up` for a local broker with one\n", url, url)
	}
	if len(m.Candidates) > 0 {
		nodes := make([]*gpupassv1.Node, len(m.Candidates))
		for i, cd := range m.Candidates {
			nodes[i] = cd.Node
		}
		if err := writeNodeTable(out, nodes); err != nil {
			return err
		}
	}
	if left := candidates - len(m.Candidates); left > 0 {
		if _, err := fmt.Fprintf(out, "%d more candidate(s) not listed (the best %d are): --limit N lists more, --all every one\n", left, len(m.Candidates)); err != nil {
			return err
		}
	}
	if err := writeGangs(out, m); err != nil {
		return err
	}
	if len(m.Excluded) > 0 {
		if _, err := fmt.Fprintln(out, "excluded:"); err != nil {
			return err
		}
		if err := writeExcluded(out, m.Excluded); err != nil {
			return err
		}
		if len(m.Excluded) == excluded {
			return nil
		}
		if _, err := fmt.Fprintf(out, "%d more excluded node(s) not listed (the nearest misses are): --limit N lists more, --all every one\n", excluded-len(m.Excluded)); err != nil {
			return err
		}
	}
	if excluded > 0 {
		// Not every excluded node is listed (--excluded summary, or the
		// limit): how many nodes each reason excludes (a node may have
		// several), and the first few of them.
		if _, err := fmt.Fprintln(out, "excluded, by reason:"); err != nil {
			return err
		}
		for _, c := range m.ReasonCounts {
			what := c.Code
			if c.Field != "" {
				what += " (" + c.Field + ")"
			}
			if len(c.ExampleNodeIds) > 0 {
				what += ", e.g. " + strings.Join(c.ExampleNodeIds, ", ")
			}
			if _, err := fmt.Fprintf(out, "  %6d  %s\n", c.Nodes, what); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeGangs prints, for a spec whose GPUs may need several nodes, each
// region's gang ("2 × agt-a, agt-b in us-west-2") or why it has none, and
// which nodes such runs are placed on.
func writeGangs(out io.Writer, m *gpupassv1.DryRunResponse) error {
	if len(m.Gangs) == 0 && len(m.GangMisses) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "gangs (one run across several nodes; placed on local agents started with --job-address and --job-ports, the nodes of one Slurm agent or Kubernetes agents started with --job-ports):\n")
	for _, g := range m.Gangs {
		fmt.Fprintf(&b, "  %d × %s in %s (%d × %s each)\n", len(g.NodeIds), termsafe.String(strings.Join(g.NodeIds, ", ")), termsafe.String(g.Region), g.GpusPerNode, termsafe.String(g.Accelerator))
	}
	for _, g := range m.GangMisses {
		fmt.Fprintf(&b, "  no gang in %s: %s\n", termsafe.String(g.Region), termsafe.String(g.Reason))
	}
	_, err := io.WriteString(out, b.String())
	return err
}
