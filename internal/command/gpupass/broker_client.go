package gpupass

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/brokerrpc"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// BrokerFlags locate and authenticate to the broker. Commands that talk to
// it embed them.
type BrokerFlags struct {
	URL   string
	Token string
	// TLSCA is a PEM file of CAs to trust for an https broker, besides
	// the system roots.
	TLSCA string
	// InsecureHTTP lets the token go over plain http:// to a broker that
	// is not on loopback (client.Options.InsecureHTTP); each command that
	// dials warns of it.
	InsecureHTTP bool
	// ErrOut hears that warning; nil: the command's stderr when AddFlags
	// registered the flags, else os.Stderr (a warning nobody can silence
	// by leaving a field unset).
	ErrOut io.Writer

	warned bool
	cmd    *cobra.Command      // set by AddFlags: where --context is, and the stderr warned on
	getenv func(string) string // nil: os.Getenv (tests inject one)
	source string              // where fromLocal found the broker
}

// AddFlags registers --broker-url (alias --broker) and --broker-token.
func (b *BrokerFlags) AddFlags(cmd *cobra.Command) {
	b.cmd = cmd
	f := cmd.Flags()
	flagenv.ListVar(f, &b.URL, "broker-url", "broker URL, e.g. http://127.0.0.1:7070; repeat it or give a comma-separated list for several replicas of one broker (the CLI moves to the next when one stops answering)")
	flagenv.ListVar(f, &b.URL, "broker", "alias of --broker-url")
	_ = f.MarkHidden("broker")
	f.StringVar(&b.Token, "broker-token", "", "broker API token (secret; also GPUPASS_BROKER_TOKEN_FILE)")
	MarkSecret("broker-token")
	f.StringVar(&b.TLSCA, "tls-ca", "", "PEM file of CA certificates to trust for an https broker URL (besides the system roots)")
	f.BoolVar(&b.InsecureHTTP, "insecure-http", false, "send the broker token over plain http:// to a broker that is not on loopback (refused without it: anyone on the path could read the token); warned of every time")
}

// Dial returns API clients, or a usage error naming the missing flag.
func (b *BrokerFlags) Dial() (*client.Clients, error) {
	o, err := b.options()
	if err != nil {
		return nil, err
	}
	return client.Dial(b.URL, o)
}

// DialRuns returns run clients, or a usage error naming the missing flag.
func (b *BrokerFlags) DialRuns() (*client.RunClients, error) {
	o, err := b.options()
	if err != nil {
		return nil, err
	}
	return client.DialRuns(b.URL, o)
}

// options checks (and may default) URL and token the same way for every
// broker command, and says which flag is missing or wrong.
func (b *BrokerFlags) options() (client.Options, error) {
	if err := b.fromLocal(); err != nil {
		return client.Options{}, err
	}
	if b.URL == "" {
		return client.Options{}, errors.New("no broker: pass --broker-url URL or set " + EnvName("broker-url") +
			", pick a context (gpupass context ls, then gpupass context use NAME), or run gpupass up in the project")
	}
	if b.Token == "" {
		return client.Options{}, errors.New("no broker token: pass --broker-token or set " + EnvName("broker-token") + " (or " + EnvName("broker-token") + "_FILE)")
	}
	tlsConf, err := api.TrustCA(b.TLSCA)
	if err != nil {
		return client.Options{}, err
	}
	if u := client.PlainHTTPOffHost(b.URL); u != "" && b.InsecureHTTP && !b.warned {
		b.warned = true
		fmt.Fprintf(b.warnOut(), "warning: the broker token goes over plain HTTP, unencrypted, to %s (--insecure-http): anyone on the network path can read it and use it; use an https:// broker URL\n", u)
	}
	return client.Options{Token: b.Token, TLSConfig: tlsConf, InsecureHTTP: b.InsecureHTTP, UserAgent: buildinfo.UserAgent("gpupass")}, nil
}

func (b *BrokerFlags) warnOut() io.Writer {
	switch {
	case b.ErrOut != nil:
		return b.ErrOut
	case b.cmd != nil:
		return b.cmd.ErrOrStderr()
	}
	return os.Stderr
}

// rpcError words a broker error for users (brokerrpc) and, when no
// broker answered, says which flag gives one; auth problems are usage
// errors (exit 2), never findings.
func rpcError(what, url string, err error) error {
	err = brokerrpc.Error(what, url, err)
	var nb *brokerrpc.NoBrokerError
	if errors.As(err, &nb) {
		return fmt.Errorf("%w with --broker-url", err)
	}
	return err
}

var protoJSON = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

func writeProtoJSON(out io.Writer, m proto.Message) error {
	b, err := protoJSON.Marshal(m)
	if err != nil {
		return fmt.Errorf("encoding JSON: %w", err)
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}

func f2(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// writeNodeTable prints nodes with the health score and each term. HOST
// is the machine, or the Slurm or Kubernetes node, the agent stands for;
// left out when no node has one (dry-run's short form carries none).
func writeNodeTable(out io.Writer, nodes []*gpupassv1.Node) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	hosts := slices.ContainsFunc(nodes, func(n *gpupassv1.Node) bool { return n.Hostname != "" })
	host := func(n *gpupassv1.Node) string {
		if !hosts {
			return ""
		}
		return termsafe.String(dash(n.Hostname)) + "\t"
	}
	head := "NODE\t"
	if hosts {
		head += "HOST\t"
	}
	fmt.Fprintln(tw, head+"PROVIDER\tREGION\tACCELERATOR\tPRICE/H\tSCORE\tLATENCY ms (-pen)\tFAIL 24h % (-pen)\tPREMIUM % (-pen)\tSTATUS")
	for _, n := range nodes {
		h := n.GetHealth()
		acc := "-"
		if n.Accelerator != "" {
			acc = fmt.Sprintf("%s x%d", termsafe.String(n.Accelerator), n.GpuCount)
		}
		lat := "n/a"
		if n.RttMs >= 0 {
			lat = fmt.Sprintf("%.1f (-%.2f)", h.GetLatencyUsedMs(), h.GetLatencyPenalty())
			if h.GetLatencyCapMs() > 0 && h.GetLatencyMs() > h.GetLatencyCapMs() {
				lat = fmt.Sprintf("%.1f capped %.0f (-%.2f)", h.GetLatencyMs(), h.GetLatencyCapMs(), h.GetLatencyPenalty())
			}
		}
		status := "online"
		if !n.Online {
			status = "offline"
			if n.LastSeenUnixNano > 0 {
				status += " since " + time.Unix(0, n.LastSeenUnixNano).UTC().Format("2006-01-02 15:04:05Z")
			}
		}
		if n.Simulated {
			status += ", simulated"
		}
		switch n.Admission {
		case "pending":
			status += ", pending admission: gpupass nodes approve " + termsafe.String(n.Id)
		case "denied":
			status += ", denied admission"
		}
		if n.Runtime != nil && !n.ConformancePassed {
			status += ", conformance failed"
			if len(n.FailedChecks) > 0 {
				status += " (" + termsafe.String(strings.Join(n.FailedChecks, "; ")) + ")"
			}
		}
		fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\t%s\t%.1f\t%s\t%s (-%s)\t%+.1f (%+.2f)\t%s\n",
			termsafe.String(n.Id), host(n), termsafe.String(dash(n.Provider)), termsafe.String(n.Region), acc, f2(n.PricePerHour), h.GetScore(), lat,
			f2(h.GetFailureRatePct()), f2(h.GetFailurePenalty()), h.GetPricePremiumPct(), -h.GetPricePenalty(), status)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// reasonAdmission is the API's reason code (Reason.code) of a node
// pending admission or denied it.
const reasonAdmission = "admission"

// writeExcluded prints every excluded node with each reason.
func writeExcluded(out io.Writer, xs []*gpupassv1.Excluded) error {
	for _, x := range xs {
		n := x.GetNode()
		var why []string
		for _, r := range x.Reasons {
			msg := r.Message
			if r.Code == reasonAdmission {
				// The broker says why in the API's terms; the
				// command that admits the node is the CLI's.
				msg += "; to admit it: gpupass nodes approve " + termsafe.String(n.GetId())
			}
			why = append(why, msg)
		}
		score := ""
		if n.GetHealth() != nil {
			score = fmt.Sprintf(", score %.1f", n.GetHealth().GetScore())
		}
		if _, err := fmt.Fprintf(out, "  %s (%s%s): %s\n", n.Id, n.Region, score, strings.Join(why, "; ")); err != nil {
			return err
		}
	}
	return nil
}
