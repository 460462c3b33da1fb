package gpupass

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// AdmitOptions are the flags of `gpupass nodes approve` and `deny`.
type AdmitOptions struct {
	Global *GlobalOptions
	Broker BrokerFlags
	// Decision is "approve" or "deny".
	Decision string
}

// AddFlags registers the broker flags.
func (o *AdmitOptions) AddFlags(cmd *cobra.Command) { o.Broker.AddFlags(cmd) }

func newNodesAdmitCmd(g *GlobalOptions, decision, short, long string) *cobra.Command {
	o := &AdmitOptions{Global: g, Decision: decision}
	cmd := &cobra.Command{
		Use:   decision + " NODE_ID...",
		Short: short,
		Long:  long,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return RunAdmit(cmd.Context(), o, args, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// RunAdmit records the decision on each node, in order, and stops at the
// first refusal.
func RunAdmit(ctx context.Context, o *AdmitOptions, ids []string, out io.Writer) error {
	c, err := o.Broker.Dial()
	if err != nil {
		return err
	}
	for _, id := range ids {
		resp, err := c.Node.SetAdmission(ctx, connect.NewRequest(&gpupassv1.SetAdmissionRequest{NodeId: id, Decision: o.Decision}))
		if err != nil {
			if connect.CodeOf(err) == connect.CodeNotFound {
				// The broker says which token's scope lacks the node;
				// the CLI names its command that lists the scope.
				return fmt.Errorf("%w; gpupass nodes lists the nodes in the token's scope", rpcError(o.Decision+" node "+termsafe.String(id), o.Broker.URL, err))
			}
			return rpcError(o.Decision+" node "+termsafe.String(id), o.Broker.URL, err)
		}
		if err := output.Write(out, o.Global.format(), admitted{resp.Msg}); err != nil {
			return err
		}
	}
	return nil
}

// admitted is one node's line of `nodes approve|deny`: as JSON, the
// API's answer, one line per node.
type admitted struct {
	m *gpupassv1.SetAdmissionResponse
}

func (a admitted) WriteJSON(w io.Writer) error { return writeProtoJSON(w, a.m) }

func (a admitted) WriteText(w io.Writer) error {
	_, err := fmt.Fprintf(w, "%s in %s: %s\n", termsafe.String(a.m.NodeId), termsafe.String(a.m.Region), termsafe.String(a.m.Admission))
	return err
}
