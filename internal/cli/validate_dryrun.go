package cli

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// DryRunOptions are validate's --dry-run flags: ask the broker which
// certified nodes can run the spec.
type DryRunOptions struct {
	Enabled        bool
	Broker         BrokerFlags
	Regions        []string
	MinHealthScore float64
	MaxPrice       float64
}

// AddFlags registers the dry-run flags.
func (o *DryRunOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&o.Enabled, "dry-run", false, "ask the broker which certified nodes match, with health scores and why others are excluded")
	o.Broker.AddFlags(cmd)
	f.StringSliceVar(&o.Regions, "region", nil, "dry-run: only these regions (glob patterns; repeatable)")
	f.Float64Var(&o.MinHealthScore, "min-health-score", api.DefaultMinHealthScore, "dry-run: exclude nodes scoring below this")
	f.Float64Var(&o.MaxPrice, "max-price", 0, "dry-run: exclude nodes above this price per hour (0: no limit)")
}

// run sends the spec file as written: the broker validates it with the
// same rules and matches it against its registry.
func (o *DryRunOptions) run(ctx context.Context, specBytes []byte) (*gpupassv1.DryRunResponse, error) {
	c, err := o.Broker.Dial()
	if err != nil {
		return nil, err
	}
	min := o.MinHealthScore
	resp, err := c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{
		Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specBytes}, Regions: o.Regions, MinHealthScore: &min, MaxPrice: o.MaxPrice,
	}))
	if err != nil {
		return nil, rpcError("dry-run", o.Broker.URL, err)
	}
	return resp.Msg, nil
}

// writeDryRunText prints candidates by score with each term, then every
// excluded node with its reasons.
func writeDryRunText(out io.Writer, url string, m *gpupassv1.DryRunResponse) error {
	fmt.Fprintf(out, "\ndry-run at %s: %d candidate(s), %d excluded (min health score %s)\n", url, len(m.Candidates), len(m.Excluded), f2(m.MinHealthScore))
	if len(m.Candidates) > 0 {
		nodes := make([]*gpupassv1.Node, len(m.Candidates))
		for i, cd := range m.Candidates {
			nodes[i] = cd.Node
		}
		if err := writeNodeTable(out, nodes); err != nil {
			return err
		}
	}
	if len(m.Excluded) > 0 {
		if _, err := fmt.Fprintln(out, "excluded:"); err != nil {
			return err
		}
		return writeExcluded(out, m.Excluded)
	}
	return nil
}
