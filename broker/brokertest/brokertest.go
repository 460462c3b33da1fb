// Package brokertest runs a real broker on a loopback port for tests, over
// a real SQLite file or a real PostgreSQL database (internal/testutil/pgtest),
// and drives it with API-client agents that hold real ECDSA keys and sign
// real conformance reports. Test packages using postgres must call
// pgtest.Run from TestMain.
package brokertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/postgres"
	"github.com/gpupass/gpupass/broker/store/sqlite"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/testutil/pgtest"
)

// Stores names the store kinds every registry test runs against.
var Stores = []string{"sqlite", "postgres"}

// DB is a database a broker (or several, or a restarted one) opens.
type DB struct {
	Kind string
	Path string // sqlite file
	DSN  string // postgres URL
}

// NewDB makes an empty database of kind.
func NewDB(t testing.TB, kind string) DB {
	t.Helper()
	switch kind {
	case "sqlite":
		return DB{Kind: kind, Path: filepath.Join(t.TempDir(), "broker.db")}
	case "postgres":
		return DB{Kind: kind, DSN: pgtest.NewDatabase(t)}
	}
	t.Fatalf("unknown store kind %q", kind)
	return DB{}
}

// Open opens a store handle on db, closed at test cleanup.
func (db DB) Open(t testing.TB) store.Store {
	t.Helper()
	var s store.Store
	var err error
	if db.Kind == "sqlite" {
		s, err = sqlite.Open(context.Background(), db.Path)
	} else {
		s, err = postgres.Open(context.Background(), db.DSN)
	}
	if err != nil {
		t.Fatalf("opening %s store: %v", db.Kind, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// URL is the --db form of db.
func (db DB) URL() string {
	if db.Kind == "sqlite" {
		return "sqlite://" + db.Path
	}
	return db.DSN
}

// Broker is a broker serving on loopback.
type Broker struct {
	URL    string
	Store  store.Store
	Broker *broker.Broker
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// Fast is a config for tests: quick flushes, no snapshot caching, and an
// offline limit long enough for a loaded CI machine (tests of offline
// detection set their own).
func Fast() broker.Config {
	return broker.Config{HeartbeatInterval: time.Second, OfflineAfter: time.Minute,
		FlushInterval: 20 * time.Millisecond, SnapshotTTL: time.Nanosecond}
}

// Start serves a broker over a new store handle on db.
func Start(t testing.TB, db DB, cfg broker.Config) *Broker {
	t.Helper()
	return StartWithOptions(t, db, cfg, broker.ServeOptions{})
}

// StartWithOptions is Start with serve options (limits; no TLS).
func StartWithOptions(t testing.TB, db DB, cfg broker.Config, o broker.ServeOptions) *Broker {
	t.Helper()
	cfg.Store = db.Open(t)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	b := broker.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sb := &Broker{URL: "http://" + ln.Addr().String(), Store: cfg.Store, Broker: b, cancel: cancel, done: make(chan error, 1)}
	go func() { sb.done <- broker.Serve(ctx, ln, b, o) }()
	t.Cleanup(func() { sb.Stop(t) })
	return sb
}

// StartTLS serves a broker over TLS with a new self-signed certificate
// for 127.0.0.1, whose PEM file it returns (what --tls-ca trusts).
func StartTLS(t testing.TB, db DB, cfg broker.Config) (b *Broker, certFile string) {
	t.Helper()
	certFile, keyFile, _ := SelfSigned(t)
	cfg.Store = db.Open(t)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	bk := broker.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sb := &Broker{URL: "https://" + ln.Addr().String(), Store: cfg.Store, Broker: bk, cancel: cancel, done: make(chan error, 1)}
	go func() {
		sb.done <- broker.Serve(ctx, ln, bk, broker.ServeOptions{TLSCertFile: certFile, TLSKeyFile: keyFile})
	}()
	t.Cleanup(func() { sb.Stop(t) })
	return sb, certFile
}

// SelfSigned writes a self-signed certificate for 127.0.0.1 and its key,
// and returns a pool that trusts it.
func SelfSigned(t testing.TB) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpupass-broker test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// Stop shuts the broker down gracefully (idempotent).
func (b *Broker) Stop(t testing.TB) {
	b.once.Do(func() {
		b.cancel()
		if err := <-b.done; err != nil {
			t.Errorf("broker shutdown: %v", err)
		}
	})
}

// Token creates a token on the broker's store and returns its secret.
func (b *Broker) Token(t testing.TB, role store.Role, regions ...string) string {
	t.Helper()
	secret, _, err := broker.CreateToken(context.Background(), b.Store, role, regions, "test")
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

// Clients dials the broker with token (Connect protocol, like the CLI).
func (b *Broker) Clients(t testing.TB, token string) *client.Clients {
	t.Helper()
	c, err := client.Dial(b.URL, client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// NodeSpec describes a simulated node.
type NodeSpec struct {
	Provider, Region, Class, GPUName string
	Count                            int
	Price                            float64
	StorageClass                     string
	FreeGB, BandwidthGbps            float64
	CUDA, Driver, Python, PyTorch    string
	FIPS                             bool
	// JobAddress and JobPortMin..JobPortMax are where the node's jobs
	// are reached: a node with them takes ranks of a gang.
	JobAddress             string
	JobPortMin, JobPortMax int32
}

// Labels are the labels an agent of n enrolls with.
func (n NodeSpec) Labels() *gpupassv1.NodeLabels {
	return &gpupassv1.NodeLabels{Provider: n.Provider, Region: n.Region, PricePerHour: n.Price, StorageClass: n.StorageClass,
		BandwidthGbps: n.BandwidthGbps, Hostname: "host-" + n.Region, JobAddress: n.JobAddress, JobPortMin: n.JobPortMin, JobPortMax: n.JobPortMax}
}

// H100 is an 8×H100 SXM5 node matching testdata/h100.yaml in region.
func H100(region string, price float64) NodeSpec {
	return NodeSpec{Provider: "lambda", Region: region, Class: "h100-sxm5", GPUName: "NVIDIA H100 80GB HBM3", Count: 8, Price: price,
		StorageClass: "ultra-nvme", FreeGB: 6500, BandwidthGbps: 400,
		CUDA: "12.1.105", Driver: "535.104.05", Python: "3.10.12", PyTorch: "2.1.0+cu121"}
}

// Agent is an API-client agent with a real identity key.
type Agent struct {
	ID      string
	Key     *ecdsa.PrivateKey
	Node    NodeSpec
	Clients *client.Clients
	echo    int64
	gotAt   time.Time
	counter uint64
	lastGen time.Time
	// SessionKey and SessionEpoch are set by EnrollProven: beats then
	// carry an HMAC instead of a signature.
	SessionKey   []byte
	SessionEpoch uint64
	// Creds prove this agent on work calls, as gpupass-agent's do: pass
	// them as client.Options.Agent (Runs does).
	Creds *api.AgentCredentials
}

// Runs dials the run services with token, proving a's identity on every
// work call.
func (a *Agent) Runs(tb testing.TB, url, token string) *client.RunClients {
	tb.Helper()
	c, err := client.DialRuns(url, client.Options{Token: token, GRPC: true, Agent: a.Creds})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// NewAgent enrolls a new agent (gRPC protocol, like gpupass-agent).
func NewAgent(t testing.TB, url, token string, n NodeSpec) *Agent {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Enroll(context.Background(), url, token, key, n)
	if err != nil {
		t.Fatalf("enrolling agent in %s: %v", n.Region, err)
	}
	return a
}

// Enroll enrolls key with labels from n, as agents before session keys
// did: no proof of key possession, so every beat is signed.
func Enroll(ctx context.Context, url, token string, key *ecdsa.PrivateKey, n NodeSpec) (*Agent, error) {
	return enroll(ctx, url, token, key, n, false)
}

// EnrollProven enrolls like gpupass-agent: with a proof of key
// possession, for a heartbeat session key.
func EnrollProven(ctx context.Context, url, token string, key *ecdsa.PrivateKey, n NodeSpec) (*Agent, error) {
	return enroll(ctx, url, token, key, n, true)
}

func enroll(ctx context.Context, url, token string, key *ecdsa.PrivateKey, n NodeSpec, prove bool) (*Agent, error) {
	c, err := client.Dial(url, client.Options{Token: token, GRPC: true})
	if err != nil {
		return nil, err
	}
	pem, err := conformance.PublicKeyPEM(key)
	if err != nil {
		return nil, err
	}
	req := &gpupassv1.EnrollRequest{PublicKeyPem: pem, AgentVersion: "test", Labels: n.Labels()}
	if prove {
		fp, err := api.KeyFingerprint(&key.PublicKey)
		if err != nil {
			return nil, err
		}
		req.ProofTimeUnixNano = time.Now().UnixNano()
		if req.Proof, err = conformance.Sign(key, api.EnrollProofPayload(fp, req.ProofTimeUnixNano)); err != nil {
			return nil, err
		}
	}
	resp, err := c.Agent.Enroll(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	creds := &api.AgentCredentials{Sign: func(p []byte) (string, error) { return conformance.Sign(key, p) }}
	creds.Set(resp.Msg.AgentId, resp.Msg.SessionKey, resp.Msg.SessionEpoch, resp.Msg.BrokerTimeUnixNano)
	return &Agent{ID: resp.Msg.AgentId, Key: key, Node: n, Clients: c, echo: resp.Msg.BrokerTimeUnixNano, gotAt: time.Now(),
		SessionKey: resp.Msg.SessionKey, SessionEpoch: resp.Msg.SessionEpoch, Creds: creds}, nil
}

// BeatRequest makes the next heartbeat as gpupass-agent makes it (with
// the session key's HMAC, or signed when there is none): the last broker
// time echoed, the counter one higher.
func (a *Agent) BeatRequest() (*gpupassv1.HeartbeatRequest, error) {
	a.counter++
	req := &gpupassv1.HeartbeatRequest{AgentId: a.ID, Counter: a.counter, EchoBrokerTimeUnixNano: a.echo}
	if a.echo != 0 {
		req.AgentHoldNanos = int64(time.Since(a.gotAt))
	}
	if a.SessionKey != nil {
		req.SessionEpoch = a.SessionEpoch
		req.Mac = api.HeartbeatMAC(a.SessionKey, req)
		return req, nil
	}
	sig, err := conformance.Sign(a.Key, api.HeartbeatPayload(req))
	if err != nil {
		return nil, err
	}
	req.Signature = sig
	return req, nil
}

// SetCounter sets the heartbeat counter the next beat raises by one
// (a second handle on the same agent continues where the first stopped).
func (a *Agent) SetCounter(c uint64) { a.counter = c }

// Beat sends one heartbeat echoing the last broker timestamp.
func (a *Agent) Beat(ctx context.Context) (*gpupassv1.HeartbeatResponse, error) {
	req, err := a.BeatRequest()
	if err != nil {
		return nil, err
	}
	resp, err := a.Clients.Heartbeat(ctx, req, a.SessionKey)
	if err != nil {
		return nil, err
	}
	a.echo, a.gotAt = resp.BrokerTimeUnixNano, time.Now()
	if a.Creds != nil { // nil for agents a test made by hand
		a.Creds.SawBrokerTime(resp.BrokerTimeUnixNano)
	}
	return resp, nil
}

// Report builds the agent's conformance report (simulated, all checks pass).
func (a *Agent) Report() *conformance.Report {
	n := a.Node
	// Each report is generated later than the last, to the millisecond,
	// as the broker requires.
	gen := time.Now().UTC().Truncate(time.Millisecond)
	if !gen.After(a.lastGen) {
		gen = a.lastGen.Add(time.Millisecond)
	}
	a.lastGen = gen
	r := &conformance.Report{
		SchemaVersion: conformance.SchemaVersion, AgentID: a.ID, Simulated: true, Profile: "test-" + n.Class,
		GeneratedAt:        gen.Format("2006-01-02T15:04:05.000Z07:00"),
		Node:               conformance.Node{Provider: n.Provider, Region: n.Region, PricePerHour: n.Price, BandwidthGbps: n.BandwidthGbps, Hostname: "host-" + n.Region},
		Runtime:            conformance.Runtime{NvidiaDriver: n.Driver, CUDA: n.CUDA, Python: n.Python, PyTorch: n.PyTorch, FIPSEnabled: n.FIPS},
		Storage:            conformance.Storage{Path: "/data", FSType: "xfs", FreeGB: n.FreeGB, ReadMBps: 5000, Class: n.StorageClass},
		Checks:             []conformance.Check{{Name: "gpu.count", Expected: fmt.Sprint(n.Count), Actual: fmt.Sprint(n.Count), Status: conformance.Pass}},
		RuntimeFingerprint: "sha256:" + n.CUDA,
	}
	for i := 0; i < n.Count; i++ {
		r.GPUs = append(r.GPUs, conformance.GPU{Index: i, Name: n.GPUName, Class: n.Class, UUID: fmt.Sprintf("GPU-%s-%d", a.ID, i),
			MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, PCIeGen: 5, PCIeWidth: 16, NVLinkActive: 18})
	}
	return r
}

// Sign returns the canonical bytes of r and their signature by key.
func Sign(key *ecdsa.PrivateKey, r *conformance.Report) ([]byte, string, error) {
	b, err := r.Marshal()
	if err != nil {
		return nil, "", err
	}
	sig, err := conformance.Sign(key, b)
	return b, sig, err
}

// Upload signs and uploads r (the agent's own report when nil).
func (a *Agent) Upload(ctx context.Context, r *conformance.Report) error {
	if r == nil {
		r = a.Report()
	}
	b, sig, err := Sign(a.Key, r)
	if err != nil {
		return err
	}
	return a.UploadRaw(ctx, b, sig)
}

// UploadRaw uploads bytes and signature as given.
func (a *Agent) UploadRaw(ctx context.Context, report []byte, sig string) error {
	_, err := a.Clients.Agent.UploadReport(ctx, connect.NewRequest(&gpupassv1.UploadReportRequest{AgentId: a.ID, Report: report, Signature: sig}))
	return err
}

// Register enrolls an agent, beats twice (so its RTT is measured) and
// uploads its report.
func Register(t testing.TB, url, token string, n NodeSpec) *Agent {
	t.Helper()
	a := NewAgent(t, url, token, n)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := a.Beat(ctx); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
	}
	if err := a.Upload(ctx, nil); err != nil {
		t.Fatalf("uploading report: %v", err)
	}
	return a
}

// Code returns the connect code of err (CodeUnknown when not an RPC error).
func Code(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}
