package broker

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	daemon "github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokermetrics"
)

// MetricsOptions are serve's flags for GET /metrics.
type MetricsOptions struct {
	TokenFile    string
	Public       bool
	RunGauges    bool
	RunGaugesMax int
}

// AddFlags registers the metrics flags.
func (o *MetricsOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.TokenFile, "metrics-token-file", "", "file holding the secret Prometheus sends as a Bearer token to GET /metrics (its authorization.credentials_file); without it /metrics takes a read or admin token scoped to '*'")
	f.BoolVar(&o.Public, "metrics-public", false, "serve GET /metrics without a token (private networks and loopback only: it counts nodes and runs of every region)")
	f.BoolVar(&o.RunGauges, "run-metrics-gauges", false, "export each run's last loss, step and step rate as gauges labelled by allocation")
	f.IntVar(&o.RunGaugesMax, "run-metrics-gauges-max", brokermetrics.DefaultRunGaugeSeries, "most runs exported by --run-metrics-gauges; the run that reported least recently is dropped")
}

// maxMetricsTokenBytes bounds the token file: a secret, not a document.
const maxMetricsTokenBytes = 4096

func (o *MetricsOptions) config() (daemon.MetricsConfig, error) {
	c := daemon.MetricsConfig{Public: o.Public, RunGauges: o.RunGauges, RunGaugesMax: o.RunGaugesMax}
	if o.RunGauges && o.RunGaugesMax < 1 {
		return c, fmt.Errorf("--run-metrics-gauges-max must be 1 or more (got %d)", o.RunGaugesMax)
	}
	if o.TokenFile == "" {
		return c, nil
	}
	fi, err := os.Stat(o.TokenFile)
	if err != nil {
		return c, fmt.Errorf("--metrics-token-file: %w", err)
	}
	if fi.Size() > maxMetricsTokenBytes {
		return c, fmt.Errorf("--metrics-token-file %s: %d bytes; a token is one line under %d bytes", o.TokenFile, fi.Size(), maxMetricsTokenBytes)
	}
	b, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return c, fmt.Errorf("--metrics-token-file: %w", err)
	}
	// Never echo the file's content: it is the secret.
	c.Token = strings.TrimSpace(string(b))
	if len(c.Token) < 16 || strings.ContainsAny(c.Token, " \t\r\n") {
		return c, fmt.Errorf("--metrics-token-file %s: want one line of at least 16 characters without spaces (e.g. openssl rand -hex 24 > %s)", o.TokenFile, o.TokenFile)
	}
	return c, nil
}
