package broker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokermetrics"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// TokenPrefix starts every gpupass API token, so secret scanners and
// people can recognise one.
const TokenPrefix = "gpp_"

// HashToken is how a token is stored: hex SHA-256 of the secret. Tokens
// are 160 random bits, so a fast hash is enough (no dictionary to try).
// FieldRegions is the field of the error for a token without regions
// (*fielderr.Error).
const FieldRegions = "token regions"

func HashToken(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// ParseRegions splits and checks a comma-separated list of region glob
// patterns ("us-*,eu-central-1").
func ParseRegions(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if err := api.CheckRegionPattern(p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, &fielderr.Error{Field: FieldRegions, Problem: "is required, e.g. 'us-*,eu-central-1' or '*'"}
	}
	return out, nil
}

// CreateToken makes a token with role and region scope, stores its hash
// and returns the secret, which is shown once and never stored.
func CreateToken(ctx context.Context, s store.Store, role store.Role, regions []string, note string) (string, store.Token, error) {
	if !role.Valid() {
		return "", store.Token{}, fmt.Errorf("role %q: use agent, submit, read or admin", role)
	}
	if len(regions) == 0 {
		return "", store.Token{}, errors.New("no region scope: give at least one pattern ('*' for all)")
	}
	buf := make([]byte, 20)
	if _, err := rand.Read(buf); err != nil {
		return "", store.Token{}, fmt.Errorf("creating token: %w", err)
	}
	secret := TokenPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(buf))
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	t := store.Token{ID: "tok-" + hex.EncodeToString(id), Hash: HashToken(secret), Role: role, Regions: regions,
		CreatedAt: time.Now().UTC().Truncate(time.Millisecond), Note: note}
	if err := s.CreateToken(ctx, t); err != nil {
		return "", store.Token{}, err
	}
	return secret, t, nil
}

// roles lists which roles may call each procedure.
var roles = map[string][]store.Role{
	gpupassv1connect.AgentServiceEnrollProcedure:       {store.RoleAgent, store.RoleAdmin},
	gpupassv1connect.AgentServiceHeartbeatProcedure:    {store.RoleAgent, store.RoleAdmin},
	gpupassv1connect.AgentServiceUploadReportProcedure: {store.RoleAgent, store.RoleAdmin},
	gpupassv1connect.NodeServiceListNodesProcedure:     {store.RoleRead, store.RoleSubmit, store.RoleAdmin},
	gpupassv1connect.NodeServiceDryRunProcedure:        {store.RoleRead, store.RoleSubmit, store.RoleAdmin},
	gpupassv1connect.NodeServiceSetAdmissionProcedure:  {store.RoleAdmin},
}

// AllowRoles lets later services (runs, logs) declare who may call their
// procedures. Unlisted procedures are refused.
func AllowRoles(procedure string, rs ...store.Role) { roles[procedure] = rs }

type tokenKey struct{}

// TokenFrom returns the authenticated caller's token.
func TokenFrom(ctx context.Context) (store.Token, bool) {
	t, ok := ctx.Value(tokenKey{}).(store.Token)
	return t, ok
}

// tokenCache keeps looked-up tokens briefly: every heartbeat is
// authenticated, and the store should not see one query per beat. A
// deleted token stops working within tokenTTL.
type tokenCache struct {
	mu sync.Mutex
	m  map[string]cachedToken
}

type cachedToken struct {
	tok     store.Token
	expires time.Time
}

const tokenTTL = 10 * time.Second

func (b *Broker) authenticate(ctx context.Context, header string) (store.Token, error) {
	scheme, secret, ok := strings.Cut(header, " ")
	if header == "" {
		return store.Token{}, connect.NewError(connect.CodeUnauthenticated, errors.New("missing token: send header "+api.AuthHeader+": Bearer <token>"))
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(secret) == "" {
		return store.Token{}, connect.NewError(connect.CodeUnauthenticated, errors.New("malformed "+api.AuthHeader+" header: want Bearer <token>"))
	}
	hash := HashToken(strings.TrimSpace(secret))
	now := time.Now()
	b.tokens.mu.Lock()
	c, hit := b.tokens.m[hash]
	b.tokens.mu.Unlock()
	if hit && now.Before(c.expires) {
		return c.tok, nil
	}
	t, err := b.store.TokenByHash(ctx, hash)
	if errors.Is(err, store.ErrNotFound) {
		return store.Token{}, connect.NewError(connect.CodeUnauthenticated, errors.New("invalid token: not known to this broker (revoked, mistyped, or from another broker)"))
	}
	if err != nil {
		b.log.Error("looking up token", "err", err)
		return store.Token{}, connect.NewError(connect.CodeUnavailable, errors.New("token store unavailable"))
	}
	b.tokens.mu.Lock()
	b.tokens.m[hash] = cachedToken{tok: t, expires: now.Add(tokenTTL)}
	b.tokens.mu.Unlock()
	return t, nil
}

// authInterceptor authenticates every call and checks its role; region
// scope is checked by each handler, which knows the regions involved.
// Served by Serve, the guard (httpguard.go) has done both from the
// headers before the body was read and left the token in the context.
func (b *Broker) authInterceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			proc := req.Spec().Procedure
			t, ok := TokenFrom(ctx)
			if !ok {
				var err error
				t, err = b.authenticate(ctx, req.Header().Get(api.AuthHeader))
				if err != nil {
					b.log.Info("refused call", "procedure", proc, "peer", req.Peer().Addr, "err", err)
					b.metrics.Refused(brokermetrics.RefusalReason(err))
					return nil, err
				}
			}
			if err := checkRole(t, proc); err != nil {
				b.log.Info("refused call", "procedure", proc, "token", t.ID, "err", err)
				b.metrics.Refused("role")
				return nil, err
			}
			return next(context.WithValue(ctx, tokenKey{}, t), req)
		}
	})
}

// checkRole refuses a token whose role may not call proc.
func checkRole(t store.Token, proc string) error {
	allowed := roles[proc]
	for _, r := range allowed {
		if r == t.Role {
			return nil
		}
	}
	names := make([]string, len(allowed))
	for i, r := range allowed {
		names[i] = string(r)
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("token %s has role %s; %s needs role %s", t.ID, t.Role, proc, strings.Join(names, " or ")))
}

// checkRegion refuses a region outside the token's scope.
func checkRegion(t store.Token, region string) error {
	for _, p := range t.Regions {
		if ok, _ := path.Match(p, region); ok {
			return nil
		}
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("region %s is outside the scope of token %s (%s)", region, t.ID, strings.Join(t.Regions, ",")))
}
