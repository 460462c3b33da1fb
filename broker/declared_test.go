package broker_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"math"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
)

// TestAbsurdNumbersRefused: two signed reports at 1.7e308/h once
// overflowed the h100 class mean to +Inf; every other premium became NaN,
// NaN passed the threshold and ranked first, so ap (60/h, excluded for its
// price) became a candidate. Numbers that are not finite or absurd are
// refused where they enter (match.TestAbsurdStoredPrices and
// health.TestCompute cover prices already stored).
func TestAbsurdNumbersRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	tok := b.Token(t, store.RoleAgent, "*")
	for _, tc := range []struct {
		field     string
		price, bw float64
	}{
		{"labels.price_per_hour", math.NaN(), 400},
		{"labels.price_per_hour", math.Inf(1), 400},
		{"labels.price_per_hour", 1.7e308, 400},
		{"labels.price_per_hour", -1, 400},
		{"labels.bandwidth_gbps", 20, math.Inf(1)},
		{"labels.bandwidth_gbps", 20, math.NaN()},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		n := brokertest.H100("us-west-2", tc.price)
		n.BandwidthGbps = tc.bw
		_, err = brokertest.Enroll(ctx, b.URL, tok, key, n)
		if brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), "from 0 to") {
			t.Errorf("enrolling with price %v, bandwidth %v: %v; want invalid_argument naming %s and its range", tc.price, tc.bw, err, tc.field)
		}
	}
	// Where a node says its jobs are reached becomes a gang's
	// MASTER_ADDR and MASTER_PORT as it is: both or neither, each what a
	// rendezvous may use.
	for _, tc := range []struct {
		addr    string
		lo, hi  int32
		field   string
		problem string
	}{
		{"10.0.0.7;id", 29500, 29599, "labels.job_address", "neither an IP address nor a host name"},
		{"", 29500, 29599, "labels.job_address", "empty"},
		{"10.0.0.7", 0, 0, "labels.job_port_min..job_port_max", "is not a TCP port"},
		{"10.0.0.7", 29599, 29500, "labels.job_port_min..job_port_max", "ends before it starts"},
		{"10.0.0.7", 1, 65535, "labels.job_port_min..job_port_max", "at most 4096"},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		n := brokertest.H100("us-west-2", 20)
		n.JobAddress, n.JobPortMin, n.JobPortMax = tc.addr, tc.lo, tc.hi
		_, err = brokertest.Enroll(ctx, b.URL, tok, key, n)
		if brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.problem) {
			t.Errorf("enrolling with job address %q, ports %d-%d: %v; want invalid_argument naming %s: %s", tc.addr, tc.lo, tc.hi, err, tc.field, tc.problem)
		}
	}
	a := brokertest.NewAgent(t, b.URL, tok, brokertest.H100("us-west-2", 20))
	if _, err := a.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	r := a.Report()
	r.Node.PricePerHour = 1.7e308
	if err := a.Upload(ctx, r); brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "node.price_per_hour") {
		t.Errorf("report at 1.7e308/h: %v; want invalid_argument naming node.price_per_hour", err)
	}
}
