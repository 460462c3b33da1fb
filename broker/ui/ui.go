// Package ui is the broker's web dashboard, served under /ui/ on the
// broker's own listener: nodes, runs with live logs and loss curves, the
// comparison `gpupass compare` makes, and cancel.
//
// Pages are server-rendered html/template; assets are embedded, so the
// dashboard needs no network at run time and no JavaScript build step.
// Every read and every action goes through the broker's API handler in
// process with the session's token (handlerTransport): the dashboard adds
// no data path and no authorisation rule of its own. It may not import
// package broker (the broker mounts it) nor any CLI code.
package ui

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
)

//go:embed assets templates
var files embed.FS

// Prefix is where the dashboard is mounted.
const Prefix = "/ui/"

// Token is what the dashboard needs to know of a token: who it is, for
// the page header, and its role, to offer only the actions the API would
// allow (the API still decides).
type Token struct {
	ID      string
	Role    string
	Regions []string
}

// Config configures the dashboard. Zero limits take the defaults.
type Config struct {
	// API is the broker's API handler; the dashboard calls it in process.
	API http.Handler
	// Lookup resolves a token secret the way the API does (the broker's
	// own lookup); an error refuses the login.
	Lookup func(ctx context.Context, secret string) (Token, error)
	Log    *slog.Logger
	// MaxSessions bounds sessions held at once (default 1000). Logins
	// with read and submit tokens may hold all but AdminReserve of them;
	// a login over that is refused until one ends or expires. An admin
	// login is never refused for want of room: past MaxSessions it ends
	// the oldest admin session (only other admins' logins end an admin's
	// session), or the oldest session when there is none.
	MaxSessions int
	// AdminReserve is the part of MaxSessions only admin tokens may use
	// (default a tenth of it; negative: none).
	AdminReserve int
	// SessionsPerToken bounds one token's sessions (default 16): its
	// next login ends its oldest session, so one token, however often it
	// logs in, holds at most this many and its newest logins work.
	SessionsPerToken int
	// SessionsPerAddress bounds the sessions of read and submit tokens
	// logged in from one client address (default 64), several tokens
	// together: the next login from it ends that address's oldest such
	// session. Admin sessions do not count here and are never ended by
	// it.
	SessionsPerAddress int
	// SessionIdle ends a session unused this long (default 1 h);
	// SessionMax ends any session this old (default 12 h).
	SessionIdle, SessionMax time.Duration
	// MaxFormBytes bounds a form body, a pasted or uploaded spec
	// included (default 64 KiB, what the broker's guard lets through for
	// paths that take no token).
	MaxFormBytes int64
}

// Defaults for Config's limits.
const (
	DefaultMaxSessions        = 1000
	DefaultSessionsPerToken   = 16
	DefaultSessionsPerAddress = 64
	DefaultSessionIdle        = time.Hour
	DefaultSessionMax         = 12 * time.Hour
	DefaultMaxFormBytes       = 64 << 10
	cookieName                = "gpupass_session"
)

// Server serves the dashboard.
type Server struct {
	cfg   Config
	log   *slog.Logger
	node  gpupassv1connect.NodeServiceClient
	run   gpupassv1connect.RunServiceClient
	tmpl  map[string]*template.Template
	mux   *http.ServeMux
	mu    sync.Mutex
	sess  map[string]*session // by hash of the cookie value
	seq   uint64              // logins so far, for session.seq
	nowFn func() time.Time
}

// session is one logged-in browser. The token secret is held here, server
// side, and never sent back to the browser.
type session struct {
	secret   string
	tok      Token
	addr     string // client address of the login (no port)
	csrf     string
	created  time.Time
	lastUsed time.Time
	// seq orders logins: created may tie on a coarse clock.
	seq uint64
}

// New returns the dashboard handler, to be mounted at Prefix.
func New(cfg Config) (*Server, error) {
	if cfg.API == nil || cfg.Lookup == nil {
		return nil, errors.New("ui: Config needs API and Lookup")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	switch {
	case cfg.AdminReserve == 0:
		cfg.AdminReserve = cfg.MaxSessions / 10
	case cfg.AdminReserve < 0:
		cfg.AdminReserve = 0
	}
	if cfg.AdminReserve >= cfg.MaxSessions {
		return nil, fmt.Errorf("ui: AdminReserve %d leaves no sessions of MaxSessions %d to other tokens", cfg.AdminReserve, cfg.MaxSessions)
	}
	if cfg.SessionsPerToken <= 0 {
		cfg.SessionsPerToken = DefaultSessionsPerToken
	}
	if cfg.SessionsPerAddress <= 0 {
		cfg.SessionsPerAddress = DefaultSessionsPerAddress
	}
	if cfg.SessionIdle <= 0 {
		cfg.SessionIdle = DefaultSessionIdle
	}
	if cfg.SessionMax <= 0 {
		cfg.SessionMax = DefaultSessionMax
	}
	if cfg.MaxFormBytes <= 0 {
		cfg.MaxFormBytes = DefaultMaxFormBytes
	}
	// The base URL is never dialled: handlerTransport serves every call.
	hc := &http.Client{Transport: handlerTransport{cfg.API}}
	const base = "http://broker.internal"
	opts := []connect.ClientOption{connect.WithReadMaxBytes(api.MaxSubmitBytes)}
	s := &Server{cfg: cfg, log: cfg.Log, sess: map[string]*session{}, nowFn: time.Now,
		node: gpupassv1connect.NewNodeServiceClient(hc, base, opts...),
		run:  gpupassv1connect.NewRunServiceClient(hc, base, opts...)}
	if err := s.parseTemplates(); err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	m := http.NewServeMux()
	assets, _ := fs.Sub(files, "assets")
	m.Handle("GET /ui/assets/", http.StripPrefix("/ui/assets/", http.FileServerFS(assets)))
	m.HandleFunc("GET /ui/login", s.loginPage)
	m.HandleFunc("POST /ui/login", s.login)
	m.HandleFunc("POST /ui/logout", s.authed(s.logout))
	m.HandleFunc("GET /ui/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/nodes", http.StatusSeeOther)
	})
	m.HandleFunc("GET /ui/nodes", s.authed(s.nodesPage))
	m.HandleFunc("POST /ui/dryrun", s.authed(s.dryRun))
	m.HandleFunc("GET /ui/runs", s.authed(s.runsPage))
	m.HandleFunc("GET /ui/runs/{id}", s.authed(s.runPage))
	m.HandleFunc("GET /ui/runs/{id}/live", s.authed(s.runLive))
	m.HandleFunc("GET /ui/runs/{id}/chart.svg", s.authed(s.runChart))
	m.HandleFunc("POST /ui/runs/{id}/cancel", s.authed(s.cancel))
	m.HandleFunc("GET /ui/compare", s.authed(s.comparePage))
	s.mux = m
}

// ServeHTTP sets the headers every dashboard response carries, then
// serves it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// Strict: scripts, styles and images only from the dashboard itself,
	// no inline script, no framing, forms post only here.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: with no-referrer Chromium sends
	// "Origin: null" on the dashboard's own form posts.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if !strings.HasPrefix(r.URL.Path, "/ui/assets/") {
		h.Set("Cache-Control", "no-store")
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxFormBytes)
		if err := sameOrigin(r); err != nil {
			s.log.Info("dashboard refused a cross-site request", "path", r.URL.Path, "peer", r.RemoteAddr, "err", err)
			http.Error(w, "refused: "+err.Error(), http.StatusForbidden)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// sameOrigin refuses a state-changing request a browser sent from
// another site: by its Origin header, or, where a browser sends none, by
// Sec-Fetch-Site. A request with neither (curl) must still carry the
// session's CSRF token, which only the dashboard's own pages hold.
func sameOrigin(r *http.Request) error {
	site := r.Header.Get("Sec-Fetch-Site")
	if o := r.Header.Get("Origin"); o == "null" {
		// An opaque origin (a sandboxed frame, a privacy setting): only
		// the browser's own Sec-Fetch-Site can vouch for it.
		if site != "same-origin" {
			return errors.New(`origin "null" and no Sec-Fetch-Site: same-origin`)
		}
	} else if o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("origin %q is not this dashboard (%s)", o, r.Host)
		}
		want := "http"
		if r.TLS != nil {
			want = "https"
		}
		if u.Scheme != want {
			return fmt.Errorf("origin %q is not this dashboard (%s://%s)", o, want, r.Host)
		}
	}
	if site != "" && site != "same-origin" && site != "none" {
		return fmt.Errorf("request sent from a %s page", site)
	}
	return nil
}

func randomString(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func sessionKey(cookie string) string {
	h := sha256.Sum256([]byte(cookie))
	return hex.EncodeToString(h[:])
}

// authed runs h with the request's session; without one it sends the
// browser to the login page. POSTs must carry the session's CSRF token.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess := s.session(r)
		if sess == nil {
			if r.Method == http.MethodGet && !strings.HasSuffix(r.URL.Path, "/live") && !strings.HasSuffix(r.URL.Path, ".svg") {
				http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
				return
			}
			http.Error(w, "not logged in: log in at /ui/login", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			got := r.PostFormValue("csrf")
			if subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) != 1 {
				s.log.Info("dashboard refused a request without its CSRF token", "path", r.URL.Path, "peer", r.RemoteAddr, "token", sess.tok.ID)
				http.Error(w, "refused: the form's CSRF token is missing or stale; reload the page and try again", http.StatusForbidden)
				return
			}
		}
		h(w, r, sess)
	}
}

// session returns the live session of r, or nil.
func (s *Server) session(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return nil
	}
	k := sessionKey(c.Value)
	now := s.nowFn()
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sess[k]
	if sess == nil {
		return nil
	}
	if s.expired(sess, now) {
		delete(s.sess, k)
		return nil
	}
	sess.lastUsed = now
	return sess
}

// newSession stores a session and returns its cookie value. To make
// room it ends, in this order: expired sessions; the oldest session of
// the same token past SessionsPerToken; for read and submit tokens the
// oldest read or submit session from the same address past
// SessionsPerAddress; for an admin past MaxSessions, the oldest admin
// session (or the oldest at all). A read or submit login that still finds
// every slot but the admin reserve taken is refused.
func (s *Server) newSession(secret string, t Token, addr string) (string, *session, error) {
	now := s.nowFn()
	admin := t.isAdmin()
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		nonAdmin, ofToken, ofAddr int
		oldToken, oldAddr         oldest
		oldAdmin, oldAny          oldest
	)
	for k, v := range s.sess {
		if s.expired(v, now) {
			delete(s.sess, k)
			continue
		}
		vAdmin := v.tok.isAdmin()
		if !vAdmin {
			nonAdmin++
			if v.addr == addr {
				ofAddr++
				oldAddr.see(k, v)
			}
		} else {
			oldAdmin.see(k, v)
		}
		oldAny.see(k, v)
		if v.tok.ID == t.ID {
			ofToken++
			oldToken.see(k, v)
		}
	}
	evict := func(k, why string) {
		v := s.sess[k]
		delete(s.sess, k)
		if !v.tok.isAdmin() {
			nonAdmin--
		}
		s.log.Info("dashboard session ended to make room", "token", v.tok.ID, "role", v.tok.Role, "peer", v.addr, "why", why)
	}
	switch {
	case ofToken >= s.cfg.SessionsPerToken:
		evict(oldToken.key, fmt.Sprintf("its token logged in again past %d sessions", s.cfg.SessionsPerToken))
	case !admin && ofAddr >= s.cfg.SessionsPerAddress:
		evict(oldAddr.key, fmt.Sprintf("another login from its address past %d sessions", s.cfg.SessionsPerAddress))
	}
	switch {
	case admin && len(s.sess) >= s.cfg.MaxSessions:
		k := oldAdmin.key
		if _, ok := s.sess[k]; !ok {
			k = oldAny.key
		}
		evict(k, fmt.Sprintf("an admin logged in past %d sessions", s.cfg.MaxSessions))
	case !admin && nonAdmin >= s.cfg.MaxSessions-s.cfg.AdminReserve:
		return "", nil, fmt.Errorf("the dashboard holds its limit of %d sessions for read and submit tokens; try again when one ends (admin tokens can still log in)",
			s.cfg.MaxSessions-s.cfg.AdminReserve)
	}
	cookie := randomString(32)
	s.seq++
	sess := &session{secret: secret, tok: t, addr: addr, csrf: randomString(24), created: now, lastUsed: now, seq: s.seq}
	s.sess[sessionKey(cookie)] = sess
	return cookie, sess, nil
}

// oldest is the key of the oldest session seen, with its seq, so that
// newSession's pass over up to MaxSessions sessions, which every login
// makes, compares without looking sessions up in the map again.
type oldest struct {
	key string
	seq uint64
}

func (o *oldest) see(k string, v *session) {
	if o.key == "" || v.seq < o.seq {
		o.key, o.seq = k, v.seq
	}
}

func (s *Server) expired(v *session, now time.Time) bool {
	return now.Sub(v.lastUsed) > s.cfg.SessionIdle || now.Sub(v.created) > s.cfg.SessionMax
}

func (t Token) isAdmin() bool { return t.Role == "admin" }

// clientAddr is the address a request came from, without its port: the
// unit SessionsPerAddress counts by.
func clientAddr(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

func (s *Server) endSession(r *http.Request) {
	if c, err := r.Cookie(cookieName); err == nil {
		s.mu.Lock()
		delete(s.sess, sessionKey(c.Value))
		s.mu.Unlock()
	}
}

// Sessions is how many sessions are held (tests, metrics).
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sess)
}

func setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: value, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "login", nil, map[string]any{"Title": "Log in"})
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	secret := strings.TrimSpace(r.PostFormValue("token"))
	fail := func(code int, msg string) {
		w.WriteHeader(code)
		s.render(w, r, "login", nil, map[string]any{"Title": "Log in", "Error": msg})
	}
	if secret == "" {
		fail(http.StatusBadRequest, "paste an API token (gpp_…): gpupass up prints one; gpupass-broker token create makes others")
		return
	}
	t, err := s.cfg.Lookup(r.Context(), secret)
	if err != nil {
		// The secret is never logged; the error names no part of it.
		s.log.Info("dashboard login refused", "peer", r.RemoteAddr, "err", err)
		fail(http.StatusUnauthorized, "login refused: "+connectMessage(err))
		return
	}
	if t.Role == "agent" {
		fail(http.StatusForbidden, "token "+t.ID+" is an agent token; the dashboard takes a read, submit or admin token")
		return
	}
	s.endSession(r)
	cookie, _, err := s.newSession(secret, t, clientAddr(r))
	if err != nil {
		fail(http.StatusServiceUnavailable, err.Error())
		return
	}
	s.log.Info("dashboard login", "token", t.ID, "role", t.Role, "peer", r.RemoteAddr)
	setCookie(w, r, cookie, int(s.cfg.SessionMax/time.Second))
	http.Redirect(w, r, "/ui/nodes", http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, sess *session) {
	s.endSession(r)
	setCookie(w, r, "", -1)
	s.log.Info("dashboard logout", "token", sess.tok.ID)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// connectMessage is an API error as one line for a page, without the
// code prefix connect adds.
func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}
