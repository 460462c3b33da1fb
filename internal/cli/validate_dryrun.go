package cli

import (
	"context"
	"encoding/json"
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

// runDryRun sends the spec file as written; validation is JSON
// (the findings document) when the output is JSON, so both travel in one
// object.
func runDryRun(ctx context.Context, o *DryRunOptions, specBytes []byte, validation json.RawMessage, jsonOut bool, out io.Writer) error {
	c, err := o.Broker.Dial()
	if err != nil {
		return err
	}
	min := o.MinHealthScore
	resp, err := c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{
		Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specBytes}, Regions: o.Regions, MinHealthScore: &min, MaxPrice: o.MaxPrice,
	}))
	if err != nil {
		return rpcError("dry-run", o.Broker.URL, err)
	}
	m := resp.Msg
	if jsonOut {
		dr, err := protoJSON.Marshal(m)
		if err != nil {
			return fmt.Errorf("encoding JSON: %w", err)
		}
		doc := struct {
			Validation json.RawMessage `json:"validation,omitempty"`
			DryRun     json.RawMessage `json:"dry_run"`
		}{validation, dr}
		if err := json.NewEncoder(out).Encode(doc); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "\ndry-run at %s: %d candidate(s), %d excluded (min health score %s)\n", o.Broker.URL, len(m.Candidates), len(m.Excluded), f2(m.MinHealthScore))
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
			fmt.Fprintln(out, "excluded:")
			if err := writeExcluded(out, m.Excluded); err != nil {
				return err
			}
		}
	}
	if len(m.Candidates) == 0 {
		return Findings(nil)
	}
	return nil
}
