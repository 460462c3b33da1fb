package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// RegistryOptions say how to reach and authenticate to the registry.
type RegistryOptions struct {
	// PlainHTTP allows http:// (loopback test registries). Without it
	// every request goes over TLS, loopback included.
	PlainHTTP bool
	// Username and Password, when set, are used instead of the docker
	// config keychain (GPUPASS_REGISTRY_USERNAME/PASSWORD).
	Username string
	Password string
	// Keychain resolves credentials when Username is empty; nil means the
	// docker config (~/.docker/config.json, $DOCKER_CONFIG, credential
	// helpers).
	Keychain authn.Keychain
	// Transport is the base HTTP transport; nil means a clone of
	// remote.DefaultTransport.
	Transport http.RoundTripper
	// Jobs is how many blobs move at once (default 4).
	Jobs int
	// Retry is the backoff for transient failures; zero means one try
	// and then ggcr's default of 3 steps from 1s.
	Retry remote.Backoff
	// UserAgent is appended to ggcr's user agent.
	UserAgent string
	// HeaderTimeout bounds the wait for a registry's response headers
	// on a pull (default 30 s), IdleTimeout a pause between bytes of a
	// response body (default 30 s): a registry that accepts the
	// connection and never answers fails the pull instead of hanging it.
	HeaderTimeout time.Duration
	IdleTimeout   time.Duration
}

// DefaultTimeout is the default HeaderTimeout and IdleTimeout.
const DefaultTimeout = 30 * time.Second

// Fields of Validate's error (*fielderr.Error).
const (
	FieldUsername = "registry username"
	FieldPassword = "registry password"
	// FieldPlainHTTP is the switch to reach a registry without TLS
	// (PlainHTTPError's fix).
	FieldPlainHTTP = "plain HTTP registry"
)

// Validate checks that credentials come as a pair: a user name alone
// would fall back to anonymous pulls and fail later, less clearly.
func (o RegistryOptions) Validate() error {
	if (o.Username == "") != (o.Password == "") {
		return &fielderr.Error{Field: FieldUsername, Problem: "and {" + FieldPassword + "} go together: give both or neither"}
	}
	return nil
}

func (o RegistryOptions) timeouts() (header, idle time.Duration) {
	header, idle = o.HeaderTimeout, o.IdleTimeout
	if header <= 0 {
		header = DefaultTimeout
	}
	if idle <= 0 {
		idle = DefaultTimeout
	}
	return header, idle
}

func (o RegistryOptions) jobs() int {
	if o.Jobs <= 0 {
		return 4
	}
	return o.Jobs
}

func (o RegistryOptions) parseRef(ref string) (name.Reference, error) {
	var opts []name.Option
	if o.PlainHTTP {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("reference %q: %w (want REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:...)", ref, err)
	}
	return r, nil
}

// baseTransport is what every registry request goes through before
// authentication: Transport or a clone of ggcr's default, TLS unless
// PlainHTTP.
func (o RegistryOptions) baseTransport() http.RoundTripper {
	base := o.Transport
	if base == nil {
		base = remote.DefaultTransport.(*http.Transport).Clone()
	}
	if !o.PlainHTTP {
		base = tlsOnly{base}
	}
	return base
}

// keychain says where credentials come from: Username and Password when
// set, else Keychain, else the docker config.
func (o RegistryOptions) keychain() authn.Keychain {
	switch {
	case o.Username != "" || o.Password != "":
		return staticKeychain{&authn.Basic{Username: o.Username, Password: o.Password}}
	case o.Keychain != nil:
		return o.Keychain
	}
	return authn.DefaultKeychain
}

type staticKeychain struct{ auth authn.Authenticator }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) { return k.auth, nil }

// remoteOptions configure ggcr for a push: it does the registry's
// handshake itself, per repository.
func (o RegistryOptions) remoteOptions(ctx context.Context) []remote.Option {
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(o.baseTransport()),
		remote.WithJobs(o.jobs()),
		remote.WithAuthFromKeychain(o.keychain()),
	}
	if o.UserAgent != "" {
		opts = append(opts, remote.WithUserAgent(o.UserAgent))
	}
	if o.Retry.Steps > 0 {
		opts = append(opts, remote.WithRetryBackoff(o.Retry))
	}
	return opts
}

// tlsOnly upgrades every plain-HTTP request to HTTPS. go-containerregistry
// speaks plain HTTP to loopback and private addresses on its own; gpupass
// wants TLS unless PlainHTTP says otherwise, so a wheel bundle is never
// fetched in the clear by accident.
type tlsOnly struct{ next http.RoundTripper }

func (t tlsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" {
		r := req.Clone(req.Context())
		r.URL.Scheme = "https"
		return t.next.RoundTrip(r)
	}
	return t.next.RoundTrip(req)
}

// DefaultRetry is the backoff the CLI uses. Registry calls keep
// go-containerregistry's own retry (remote.WithRetryBackoff, its
// transport.NewRetry in pullTransport) rather than internal/retry, the
// project's one policy elsewhere: ggcr retries inside a call (a blob's
// upload or ranged read, a token handshake) at points only it sees, decides
// with its status codes and our retryable predicate what may be resent,
// and wraps the transport every registry call goes through, so no loop of
// ours is there to take a delay from internal/retry.
var DefaultRetry = remote.Backoff{Duration: time.Second, Factor: 3.0, Jitter: 0.1, Steps: 3}

// PlainHTTPError is a registry that answered a TLS request in plain
// HTTP: PlainHTTP was not set for a registry that speaks nothing else.
type PlainHTTPError struct{ Registry string }

func (e *PlainHTTPError) Error() string {
	return fmt.Sprintf("the registry %s speaks plain HTTP: add %s", e.Registry, e.fix())
}

// fix is the switch, as a field error so that the command layer names its
// flag or input (it is in Unwrap's tree).
func (e *PlainHTTPError) fix() *fielderr.Error {
	return &fielderr.Error{Field: FieldPlainHTTP, Problem: "if it is a test registry you mean to reach without TLS"}
}

func (e *PlainHTTPError) Unwrap() error { return e.fix() }

// plainHTTP is err as a *PlainHTTPError when the registry answered TLS in
// plain HTTP, else nil. Go's and ggcr's own wording would print the HTTPS
// try and ggcr's plain-HTTP fallback (which tlsOnly upgrades again).
func plainHTTP(err error) error {
	if !errors.Is(err, http.ErrSchemeMismatch) {
		return nil
	}
	pe := &PlainHTTPError{}
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			pe.Registry = u.Host
		}
	}
	return pe
}

// checkTLS asks the registry's /v2/ once whether it speaks TLS, before
// a push's uploads: each of them would fail on its own, one error per
// blob. Any other failure is left to the push, with its retries.
func (o RegistryOptions) checkTLS(ctx context.Context, reg name.Registry) error {
	if o.PlainHTTP {
		return nil
	}
	header, _ := o.timeouts()
	ctx, cancel := context.WithTimeout(ctx, header)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+reg.RegistryStr()+"/v2/", nil)
	if err != nil {
		return nil
	}
	resp, err := (&http.Client{Transport: o.baseTransport(), CheckRedirect: checkRedirect}).Do(req)
	if err != nil {
		return plainHTTP(err)
	}
	resp.Body.Close()
	return nil
}

// explain adds what to do about a registry's refusal; ggcr's error says
// only what the registry said.
func explain(err error) error {
	if pe := plainHTTP(err); pe != nil {
		return pe
	}
	var te *transport.Error
	if !errors.As(err, &te) {
		return err
	}
	switch te.StatusCode {
	case http.StatusUnauthorized:
		return fmt.Errorf("%w (HTTP 401: log in with `docker login` or set GPUPASS_REGISTRY_USERNAME and GPUPASS_REGISTRY_PASSWORD)", err)
	case http.StatusForbidden:
		return fmt.Errorf("%w (HTTP 403: the credentials lack permission on this repository)", err)
	case http.StatusNotFound:
		return fmt.Errorf("%w (HTTP 404: no such repository, tag or blob)", err)
	case http.StatusTooManyRequests:
		return fmt.Errorf("%w (HTTP 429: rate limited; try again later)", err)
	default:
		if te.StatusCode >= 500 {
			return fmt.Errorf("%w (HTTP %d: the registry failed; a re-run resumes)", err, te.StatusCode)
		}
	}
	return err
}

// retryStatusCodes are the answers ggcr retries by default (its
// defaultRetryStatusCodes), which blobClient retries too.
var retryStatusCodes = []int{
	http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
	http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout, 499, 522,
}

// retryable is ggcr's default retry predicate: a network failure before
// the answer arrived.
func retryable(err error) bool {
	var temp interface{ Temporary() bool }
	if errors.As(err, &temp) && temp.Temporary() {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// pullTransport authenticates to repo once for everything a pull or an
// inspect reads there (manifest, lock, referrers, blobs), with what ggcr
// would add on its own: retries of its default status codes and network
// failures, our backoff, the user agent. Pull fetches wheels through it
// directly rather than through ggcr's layer reader, which hashes every
// byte in a reader of its own: Pull hashes them as it writes them to disk
// (receive), and checks sizes and Content-Length itself (openBlob). The
// result is a transport.Wrapper, which ggcr uses as it is, without a
// handshake of its own.
func (o RegistryOptions) pullTransport(ctx context.Context, repo name.Repository) (http.RoundTripper, error) {
	backoff := o.Retry
	if backoff.Steps == 0 {
		backoff = DefaultRetry
	}
	header, idle := o.timeouts()
	rt := transport.NewRetry(deadlines{o.baseTransport(), header, idle}, transport.WithRetryBackoff(backoff), transport.WithRetryPredicate(retryable),
		transport.WithRetryStatusCodes(retryStatusCodes...))
	if o.UserAgent != "" {
		rt = transport.NewUserAgent(rt, o.UserAgent)
	}
	auth, err := authn.Resolve(ctx, o.keychain(), repo)
	if err != nil {
		return nil, fmt.Errorf("credentials for %s: %w", repo, err)
	}
	tr, err := transport.NewWithContext(ctx, repo.Registry, auth, rt, []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, redactURL(err)
	}
	return tr, nil
}

// checkRedirect refuses a redirect from the registry to a private,
// loopback or link-local IP literal on another host: a hostile registry
// must not make the puller fetch from the node's metadata service
// (169.254.169.254) or its internal network. It is ggcr's own rule
// (remote.checkRedirectSSRF, unexported), kept for the blobs Pull fetches
// itself; redirects to DNS names are allowed, as there.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if len(via) == 0 || req.Response == nil {
		return nil
	}
	from, to := via[0].URL.Hostname(), req.URL.Hostname()
	if to == from {
		return nil
	}
	if a, ok := parseIPLiteral(to); ok && (a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsPrivate() || a.IsUnspecified()) {
		return fmt.Errorf("registry %s redirected to %s, a private or link-local address: refused (a registry may send blobs to storage, not into the node's own network)", from, to)
	}
	return nil
}

// parseIPLiteral reads host as an IP address the dialer would connect
// to: zone dropped, IPv4-mapped IPv6 as IPv4, and the legacy IPv4 forms
// the C resolver accepts ("127.1", "0x7f.0.0.1", "2130706433").
func parseIPLiteral(host string) (netip.Addr, bool) {
	host, _, _ = strings.Cut(host, "%")
	if a, err := netip.ParseAddr(host); err == nil {
		return a.WithZone("").Unmap(), true
	}
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, part := range parts[:len(parts)-1] {
		v, err := strconv.ParseUint(part, 0, 8)
		if err != nil {
			return netip.Addr{}, false
		}
		b[i] = byte(v)
	}
	// The last part fills the bytes that remain: "127.1" is 127.0.0.1.
	last, err := strconv.ParseUint(parts[len(parts)-1], 0, [...]int{32, 24, 16, 8}[len(parts)-1])
	if err != nil {
		return netip.Addr{}, false
	}
	for i := len(parts) - 1; i < 4; i++ {
		b[i] = byte(last >> (8 * (3 - i)))
	}
	return netip.AddrFrom4(b), true
}

// openBlob starts the download of blob d of repo. The caller checks the
// digest; the size is checked against Content-Length here when the
// registry sends one.
func openBlob(ctx context.Context, c *http.Client, repo name.Repository, d v1.Descriptor) (io.ReadCloser, error) {
	u := url.URL{Scheme: repo.Scheme(), Host: repo.RegistryStr(), Path: fmt.Sprintf("/v2/%s/blobs/%s", repo.RepositoryStr(), d.Digest)}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, redactURL(err)
	}
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		resp.Body.Close()
		return nil, err
	}
	if resp.ContentLength != -1 && resp.ContentLength != d.Size {
		resp.Body.Close()
		return nil, fmt.Errorf("%w: GET %s: Content-Length %d, the manifest says %d bytes", ErrVerification, u.Redacted(), resp.ContentLength, d.Size)
	}
	return resp.Body, nil
}

// redactURL drops the query from the URL in a failed request's error:
// a registry may redirect a blob to storage with a signed URL, and the
// signature is a credential. It returns a copy and never changes err:
// the same error can reach several goroutines at once (errgroup hands the
// first failure to the others as their context's cause).
func redactURL(err error) error {
	ue, ok := err.(*url.Error)
	if !ok {
		return err
	}
	u, perr := url.Parse(ue.URL)
	if perr != nil || u.RawQuery == "" {
		return err
	}
	u.RawQuery = "REDACTED"
	return &url.Error{Op: ue.Op, URL: u.String(), Err: ue.Err}
}

// deadlines fails a request whose response headers do not arrive within
// header, and a response body that stalls for idle, each with an error
// naming the registry. It bounds each try (it sits under the retries). A
// pull sends no request bodies, so the header wait starts with the
// request; a push's uploads do not go through it.
type deadlines struct {
	next         http.RoundTripper
	header, idle time.Duration
}

// TimeoutError is a registry that did not answer in time.
type TimeoutError struct {
	Registry string
	What     string // "response headers" or "the next bytes of a response"
	After    time.Duration
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("registry %s sent no %s within %s (is it overloaded, or not a registry? raise the registry timeout for a slow one)", e.Registry, e.What, e.After)
}

func (d deadlines) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	t := time.AfterFunc(d.header, func() {
		cancel(&TimeoutError{Registry: req.URL.Host, What: "response headers", After: d.header})
	})
	resp, err := d.next.RoundTrip(req.WithContext(ctx))
	if !t.Stop() {
		// Fired: whatever came back came too late or was cut by it.
		if resp != nil {
			resp.Body.Close()
		}
		return nil, context.Cause(ctx)
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = &idleBody{rc: resp.Body, ctx: ctx, cancel: cancel, idle: d.idle, host: req.URL.Host}
	return resp, nil
}

// idleBody cancels its request when one Read waits longer than idle.
type idleBody struct {
	rc     io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   time.Duration
	host   string
	t      *time.Timer
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.t == nil {
		b.t = time.AfterFunc(b.idle, func() {
			b.cancel(&TimeoutError{Registry: b.host, What: "the next bytes of a response", After: b.idle})
		})
	} else {
		b.t.Reset(b.idle)
	}
	n, err := b.rc.Read(p)
	if !b.t.Stop() && err != nil {
		return n, context.Cause(b.ctx)
	}
	return n, err
}

func (b *idleBody) Close() error {
	if b.t != nil {
		b.t.Stop()
	}
	err := b.rc.Close()
	b.cancel(nil)
	return err
}
