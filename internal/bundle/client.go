package bundle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Client is the registry client of one repository for other kinds of
// artifact (model provenance, internal/model): the same transport, TLS
// rule, credentials, retries, timeouts, redirect rule and manifest size
// bound as a bundle's pull and push, so that there is one registry client.
type Client struct {
	// Ref is the reference the client was opened for.
	Ref name.Reference
	// Pull are ggcr options for reads (one handshake for the repository,
	// the pull's timeouts and retries).
	Pull []remote.Option
	// Push are ggcr options for writes (ggcr does its own handshake).
	Push []remote.Option
	http *http.Client
	opts RegistryOptions
}

// MaxManifest is the most a Client reads of a manifest.
const MaxManifest = maxManifest

// ParseReference parses ref as the registry options read it (plain HTTP
// allowed only with PlainHTTP).
func (o RegistryOptions) ParseReference(ref string) (name.Reference, error) {
	return o.parseRef(ref)
}

// Open returns a client for the repository of ref. push also prepares
// ggcr's push options and checks the registry speaks TLS unless
// PlainHTTP.
func (o RegistryOptions) Open(ctx context.Context, ref string, push bool) (*Client, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	r, err := o.parseRef(ref)
	if err != nil {
		return nil, err
	}
	c := &Client{Ref: r, opts: o}
	if push {
		if err := o.checkTLS(ctx, r.Context().Registry); err != nil {
			return nil, err
		}
		c.Push = o.remoteOptions(ctx)
		// A push also reads (the subject's descriptor, the referrers
		// fallback index): through the same transport and credentials.
		c.Pull = c.Push
		return c, nil
	}
	tr, err := o.pullTransport(ctx, r.Context())
	if err != nil {
		return nil, Explain(err)
	}
	c.Pull = []remote.Option{remote.WithContext(ctx), remote.WithTransport(tr), remote.WithJobs(o.jobs())}
	c.http = &http.Client{Transport: tr, CheckRedirect: checkRedirect}
	return c, nil
}

// Manifest reads the manifest at r (in the client's repository): at most
// MaxManifest bytes, which must hash to the digest the registry states
// and, for a reference by digest, to that digest. It returns the bytes,
// their digest and the Content-Type.
func (c *Client) Manifest(ctx context.Context, r name.Reference) ([]byte, v1.Hash, string, error) {
	if c.http == nil {
		return nil, v1.Hash{}, "", fmt.Errorf("reading %s: the client was opened for a push", r)
	}
	return getManifest(ctx, c.http, r)
}

// CheckManifest parses raw as an image manifest and checks its shape
// (see checkManifest): schema 2, well-formed descriptors.
func CheckManifest(raw []byte, contentType string) (*v1.Manifest, error) {
	return checkManifest(raw, contentType)
}

// Blob opens blob d of the client's repository, refusing a response whose
// Content-Length differs from d.Size. The caller checks the digest and
// bounds what it reads.
func (c *Client) Blob(ctx context.Context, d v1.Descriptor) (io.ReadCloser, error) {
	if c.http == nil {
		return nil, fmt.Errorf("reading blob %s: the client was opened for a push", d.Digest)
	}
	return openBlob(ctx, c.http, c.Ref.Context(), d)
}

// Explain adds to a registry's refusal what to do about it (log in, the
// plain-HTTP switch, try again later).
func Explain(err error) error { return explain(err) }

// MaxReferrersIndex bounds what Referrers reads of a referrers list.
const MaxReferrersIndex = maxManifest

// Referrers lists the manifests whose subject is d, as OCI 1.1 clients
// find them: the registry's referrers API, or on a registry without it
// (404, 400, 406) the index under the sha256-<hex> tag; no tag means none.
// It reads at most MaxReferrersIndex bytes and says which path answered
// ("referrers API" or the fallback tag). ggcr's remote.Referrers reads a
// list of any size.
func (c *Client) Referrers(ctx context.Context, d name.Digest) (*v1.IndexManifest, string, error) {
	if c.http == nil {
		return nil, "", fmt.Errorf("listing referrers of %s: the client was opened for a push", d)
	}
	repo := d.Context()
	u := url.URL{Scheme: repo.Scheme(), Host: repo.RegistryStr(), Path: fmt.Sprintf("/v2/%s/referrers/%s", repo.RepositoryStr(), d.DigestStr())}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Accept", string(types.OCIImageIndex))
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, "", redactURL(err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		if resp.ContentLength > MaxReferrersIndex {
			return nil, "", fmt.Errorf("%w: registry %s announces a referrers list of %d bytes, at most %d are read", ErrVerification, repo.RegistryStr(), resp.ContentLength, MaxReferrersIndex)
		}
		raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxReferrersIndex+1))
		if err != nil {
			return nil, "", redactURL(err)
		}
		if len(raw) > MaxReferrersIndex {
			return nil, "", fmt.Errorf("%w: registry %s sent more than %d bytes of referrers list (stopped reading)", ErrVerification, repo.RegistryStr(), MaxReferrersIndex)
		}
		var idx v1.IndexManifest
		if err := json.Unmarshal(raw, &idx); err == nil && idx.SchemaVersion == 2 {
			return &idx, "referrers API", nil
		}
		// Not an index: a registry that routes the path elsewhere.
	case http.StatusNotFound, http.StatusBadRequest, http.StatusNotAcceptable:
	default:
		return nil, "", transport.CheckError(resp, http.StatusOK)
	}
	tag := repo.Tag(strings.Replace(d.DigestStr(), ":", "-", 1))
	via := "tag " + tag.TagStr()
	raw, _, _, err := getManifest(ctx, c.http, tag)
	var te *transport.Error
	if errors.As(err, &te) && te.StatusCode == http.StatusNotFound {
		return &v1.IndexManifest{SchemaVersion: 2}, via, nil
	}
	if err != nil {
		return nil, "", err
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, "", fmt.Errorf("%w: the referrers tag %s is not an index: %w", ErrVerification, tag, err)
	}
	return &idx, via, nil
}
