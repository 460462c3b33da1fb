package broker

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/retry"
)

// Webhooks (issue #35): when every run of a group has ended, the broker
// POSTs a signed JSON event to each webhook an operator configured whose
// regions hold one of the group's runs. Nothing here runs on the paths of
// placement, heartbeats or logs: the once-only sweep (lease.go) notices
// ended groups in the store and stores one delivery per webhook and group
// (a unique pair: once, whichever replica noticed); a bounded queue feeds
// a few workers that make each attempt under a timeout and record it. A
// full queue drops nothing: the delivery stays due in the store for the
// next sweep. Redirects are never followed: only the configured URL is
// called, and a 3xx is a failed attempt.

// Webhook headers, in the form GitHub uses for its own webhooks.
const (
	HeaderEvent     = "X-Gpupass-Event"
	HeaderDelivery  = "X-Gpupass-Delivery"
	HeaderSignature = "X-Gpupass-Signature-256"
	// EventGroupEnded is the event sent when every run of a group ended.
	EventGroupEnded = "group.ended"
)

// WebhookConfig tunes deliveries; zero fields take the defaults.
type WebhookConfig struct {
	// Timeout bounds one attempt, connection to last byte (default 10 s).
	Timeout time.Duration
	// RetryMin and RetryMax bound the back-off between attempts
	// (internal/retry; defaults 10 s and 10 minutes).
	RetryMin, RetryMax time.Duration
	// MaxAttempts bounds the attempts of one delivery (default 10).
	MaxAttempts int
	// Sweep is how often ended groups and due deliveries are looked for
	// (default 2 s).
	Sweep time.Duration
	// Workers make attempts at once (default 4); Queue bounds the
	// deliveries waiting for a worker (default 256).
	Workers, Queue int
	// Settle is how long a group's last run must have ended before the
	// group counts as ended (default 2 s): gpupass train submits a
	// group's regions one after another, and a run refused at once must
	// not end its group before the next region's run joins it.
	Settle time.Duration
	// PublicURL is where users reach this broker's dashboard; when set,
	// each run's links.run is its page there.
	PublicURL string
	// Transport, when set, replaces the HTTP transport (tests).
	Transport http.RoundTripper
}

func (c WebhookConfig) withDefaults() WebhookConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Timeout, 10*time.Second)
	def(&c.RetryMin, 10*time.Second)
	def(&c.RetryMax, 10*time.Minute)
	def(&c.Sweep, 2*time.Second)
	def(&c.Settle, 2*time.Second)
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 10
	}
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.Queue <= 0 {
		c.Queue = 256
	}
	return c
}

// endedPage is how many ended groups one sweep reads at most.
const endedPage = 500

// webhookStoreTimeout bounds each store write of a delivery attempt
// (its claim, its record), apart from the attempt's own timeout.
const webhookStoreTimeout = 10 * time.Second

// endedLookback is how far back a broker that takes up the sweep looks
// for groups that ended (while no broker was sweeping).
const endedLookback = time.Hour

// CheckWebhookURL refuses a URL the broker would not call: https, or
// plain http to a loopback host only (a receiver on the broker's own
// machine), as the rest of gpupass treats plain HTTP.
func CheckWebhookURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("%q is not an absolute URL: give https://HOST/PATH", raw)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && client.LoopbackHost(u.Hostname()):
	case u.Scheme == "http":
		return nil, fmt.Errorf("%s: plain http:// is allowed only to a loopback host (127.0.0.1, ::1, localhost); the payload and its signature would cross the network unencrypted: use https://", RedactURL(u))
	default:
		return nil, fmt.Errorf("%s: scheme %q: use https:// (or http:// to a loopback host)", RedactURL(u), u.Scheme)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%s: credentials in the URL would be stored and shown; sign with the webhook's secret instead", RedactURL(u))
	}
	return u, nil
}

// RedactURL is u as listings and logs show it: without credentials and
// with query values hidden (a forge trigger token is often one).
func RedactURL(u *url.URL) string {
	c := *u
	c.User = nil
	if c.RawQuery != "" {
		q := c.Query()
		for k := range q {
			q[k] = []string{"REDACTED"}
		}
		c.RawQuery = q.Encode()
	}
	return c.String()
}

// ErrShortSecret refuses a webhook secret that could be guessed.
var ErrShortSecret = errors.New("the secret is shorter than 16 bytes")

// AddWebhook stores a webhook (gpupass-broker webhook add) and returns it.
func AddWebhook(ctx context.Context, s store.Store, rawURL string, secret []byte, regions []string) (store.Webhook, error) {
	ws, ok := s.(store.Webhooks)
	if !ok {
		return store.Webhook{}, errors.New("this store keeps no webhooks")
	}
	if _, err := CheckWebhookURL(rawURL); err != nil {
		return store.Webhook{}, err
	}
	if len(bytes.TrimSpace(secret)) < 16 {
		return store.Webhook{}, ErrShortSecret
	}
	if len(regions) == 0 {
		regions = []string{"*"}
	}
	w := store.Webhook{ID: randomID("hook-", 4), URL: rawURL, Secret: bytes.TrimSpace(secret), Regions: regions, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	return w, ws.CreateWebhook(ctx, w)
}

// Sign is the value of HeaderSignature for body: "sha256=" and the hex
// HMAC-SHA256 of the exact body with the webhook's secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// GroupEvent is the body of a group.ended delivery.
type GroupEvent struct {
	Event    string     `json:"event"`
	Delivery string     `json:"delivery"`
	Group    string     `json:"group"`
	EndedAt  time.Time  `json:"ended_at"`
	Runs     []GroupRun `json:"runs"`
	// CI is where the group was submitted from (gpupass train in a CI
	// job); absent when it was not. Submitter-provided: see GroupCI.
	CI *GroupCI `json:"ci,omitempty"`
}

// GroupCI is the CI job a run group was submitted from, as its
// submitter said (checked by api.CheckCIContext, stored with the group):
// the pull or merge request a workflow the event starts comments on. It
// proves nothing about the runs; a receiver uses it only within the
// repository it starts workflows in (SECURITY.md).
type GroupCI struct {
	Forge       string `json:"forge"`
	Repository  string `json:"repository"`
	PullRequest int64  `json:"pull_request,omitempty"`
	SHA         string `json:"sha,omitempty"`
	RunURL      string `json:"run_url,omitempty"`
	ProjectID   string `json:"project_id,omitempty"`
}

// GroupRun is one run of a GroupEvent (those in the webhook's regions).
type GroupRun struct {
	Allocation string            `json:"allocation"`
	Region     string            `json:"region"`
	Name       string            `json:"name"`
	State      string            `json:"state"`
	Reason     string            `json:"reason"`
	Links      map[string]string `json:"links"`
}

type hookState struct {
	cfg      WebhookConfig
	http     *http.Client
	queue    chan hookJob
	mu       sync.Mutex
	inFlight map[string]bool
	since    time.Time
	page     int                  // ended groups read per sweep at most
	done     map[string]time.Time // groups handled lately: skip a re-read
}

type hookJob struct {
	d    store.Delivery
	hook store.Webhook
}

func (b *Broker) startWebhooks() {
	cfg := b.cfg.Webhooks.withDefaults()
	tr := cfg.Transport
	if tr == nil {
		tr = http.DefaultTransport.(*http.Transport).Clone()
	}
	b.hooks = &hookState{cfg: cfg, queue: make(chan hookJob, cfg.Queue), inFlight: map[string]bool{}, done: map[string]time.Time{},
		since: time.Now().Add(-endedLookback), page: endedPage,
		http: &http.Client{Transport: tr, Timeout: cfg.Timeout,
			// Only the configured URL is called: a redirect is answered,
			// recorded and retried, never followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	b.wg.Add(1 + cfg.Workers)
	go b.every(cfg.Sweep, 30*time.Second, "webhooks", b.onceOnly(b.sweepWebhooks))
	for range cfg.Workers {
		go b.deliverLoop()
	}
}

// sweepWebhooks stores a delivery for each group that ended and queues
// the deliveries that are due.
func (b *Broker) sweepWebhooks(ctx context.Context) error {
	ws, ok := b.store.(store.Webhooks)
	rs, rok := b.store.(store.Runs)
	if !ok || !rok {
		return nil
	}
	hooks, err := ws.ListWebhooks(ctx)
	if err != nil {
		return err
	}
	h := b.hooks
	now := time.Now()
	until := now.Add(-h.cfg.Settle)
	if len(hooks) == 0 {
		// A webhook added later hears of groups that end from then on
		// (and the last minute), not of every group since this start.
		h.since = until.Add(-time.Minute)
		return nil
	}
	// A replica that takes the sweep up again after a long while looks
	// back no further than a broker that starts: the holder meanwhile
	// handled the rest, and each sweep would read the whole gap again.
	if floor := now.Add(-endedLookback); h.since.Before(floor) {
		h.since = floor
	}
	groups, err := ws.EndedGroups(ctx, h.since, until, h.page)
	if err != nil {
		return err
	}
	for _, g := range groups {
		if _, seen := h.done[g.ID]; seen {
			continue
		}
		if err := b.groupEnded(ctx, ws, rs, hooks, g.ID, now); err != nil {
			return err
		}
		h.done[g.ID] = now
	}
	if len(groups) < h.page {
		// Look again at a minute past, for replicas' clocks and writes
		// that commit late; done keeps that from costing a delivery
		// each time.
		h.since = until.Add(-time.Minute)
	} else {
		// A full page, in the order the groups ended: the next sweep
		// goes on after the last one's end. Staying put read the same
		// page every sweep and never reached the groups after it.
		h.since = groups[len(groups)-1].LastUpdate
	}
	for g, at := range h.done {
		if now.Sub(at) > 5*time.Minute {
			delete(h.done, g)
		}
	}
	due, err := ws.DueDeliveries(ctx, now, h.cfg.Queue)
	if err != nil {
		return err
	}
	byID := map[string]store.Webhook{}
	for _, w := range hooks {
		byID[w.ID] = w
	}
	for _, d := range due {
		h.mu.Lock()
		busy := h.inFlight[d.ID]
		if !busy {
			h.inFlight[d.ID] = true
		}
		h.mu.Unlock()
		if busy {
			continue
		}
		select {
		case h.queue <- hookJob{d: d, hook: byID[d.WebhookID]}:
		default:
			// Full: it stays due in the store; never wait here.
			h.mu.Lock()
			delete(h.inFlight, d.ID)
			h.mu.Unlock()
			return nil
		}
	}
	return nil
}

// groupEnded stores the deliveries of an ended group, one per webhook
// whose regions hold one of its runs.
func (b *Broker) groupEnded(ctx context.Context, ws store.Webhooks, rs store.Runs, hooks []store.Webhook, group string, now time.Time) error {
	runs, err := rs.GroupAllocs(ctx, group, maxGroupRuns)
	if err != nil {
		return err
	}
	var ci *GroupCI
	if raw, err := rs.GroupCI(ctx, group); err != nil {
		return err
	} else if raw != nil {
		ci = &GroupCI{}
		if err := json.Unmarshal(raw, ci); err != nil {
			return fmt.Errorf("the CI context of group %s: %w", group, err)
		}
	}
	for _, w := range hooks {
		ev := GroupEvent{Event: EventGroupEnded, Delivery: randomID("dlv-", 8), Group: group, CI: ci}
		for _, a := range runs {
			if !match.MatchRegion(w.Regions, a.Region) {
				continue
			}
			links := map[string]string{}
			if page := b.runPage(a.ID); page != "" {
				links["run"] = page
			}
			ev.Runs = append(ev.Runs, GroupRun{Allocation: a.ID, Region: a.Region, Name: a.Name, State: string(a.State), Reason: a.Reason, Links: links})
			ev.EndedAt = maxTime(ev.EndedAt, maxTime(a.FinishedAt, a.UpdatedAt)).UTC()
		}
		if len(ev.Runs) == 0 {
			continue
		}
		body, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if _, err := ws.CreateDelivery(ctx, store.Delivery{ID: ev.Delivery, WebhookID: w.ID, Group: group, Event: EventGroupEnded, Body: body,
			State: store.DeliveryPending, NextAt: now, Created: now}); err != nil {
			return err
		}
	}
	return nil
}

func (b *Broker) deliverLoop() {
	defer b.wg.Done()
	for {
		select {
		case <-b.stop:
			return
		case j := <-b.hooks.queue:
			b.deliver(j)
			b.hooks.mu.Lock()
			delete(b.hooks.inFlight, j.d.ID)
			b.hooks.mu.Unlock()
		}
	}
}

// deliver makes one attempt of a due delivery and records it.
func (b *Broker) deliver(j hookJob) {
	ws := b.store.(store.Webhooks)
	cfg := b.hooks.cfg
	d := j.d
	claimCtx, cancelClaim := context.WithTimeout(context.Background(), webhookStoreTimeout)
	defer cancelClaim()
	// Claimed past the attempt's end: no other sweep sends it meanwhile.
	if ok, err := ws.ClaimDelivery(claimCtx, d.ID, d.NextAt, time.Now().Add(cfg.Timeout+30*time.Second)); err != nil || !ok {
		if err != nil {
			b.log.Error("claiming webhook delivery", "delivery", d.ID, "err", err)
		}
		return
	}
	// A broker stopping cuts the attempt and records nothing: the claim
	// runs out and the next sweep (this replica's or another's) sends it.
	sendCtx, stopSend := context.WithCancel(context.Background())
	defer stopSend()
	go func() {
		select {
		case <-b.stop:
			stopSend()
		case <-sendCtx.Done():
		}
	}()
	start := time.Now()
	status, attemptErr := b.post(sendCtx, j.hook, d)
	if sendCtx.Err() != nil {
		return
	}
	a := store.Attempt{N: d.Attempts + 1, At: start.UTC(), Status: status, Duration: time.Since(start)}
	d.Attempts++
	result := "delivered"
	switch {
	case attemptErr == nil:
		d.State = store.DeliveryDelivered
	case d.Attempts >= cfg.MaxAttempts:
		a.Error, d.State, result = attemptErr.Error(), store.DeliveryFailed, "failed"
	default:
		a.Error, d.State, result = attemptErr.Error(), store.DeliveryPending, "retry"
		bo := retry.Backoff(cfg.RetryMin, cfg.RetryMax)
		wait := bo.NextBackOff()
		for range d.Attempts - 1 {
			wait = bo.NextBackOff()
		}
		d.NextAt = time.Now().Add(wait)
	}
	b.metrics.WebhookDelivery(result)
	// Never the URL's query or the secret: the id names the webhook.
	b.log.Info("webhook delivery attempt", "webhook", d.WebhookID, "delivery", d.ID, "group", d.Group, "attempt", a.N,
		"status", status, "err", a.Error, "duration", a.Duration.Round(time.Millisecond), "state", d.State)
	// A context of its own, begun after the attempt: one begun before it
	// would have run out when the attempt took its whole timeout (10 s by
	// default), and the attempt would go unrecorded and be made again
	// without end.
	ctx, cancel := context.WithTimeout(context.Background(), webhookStoreTimeout)
	defer cancel()
	if err := ws.FinishAttempt(ctx, d, a); err != nil {
		b.log.Error("recording webhook delivery attempt", "delivery", d.ID, "err", err)
	}
}

// post sends d once: nil for a 2xx answer, else why not.
func (b *Broker) post(ctx context.Context, hook store.Webhook, d store.Delivery) (int, error) {
	if hook.ID == "" {
		return 0, errors.New("webhook removed")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hook.URL, bytes.NewReader(d.Body))
	if err != nil {
		return 0, fmt.Errorf("building the request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "gpupass-broker")
	req.Header.Set(HeaderEvent, d.Event)
	req.Header.Set(HeaderDelivery, d.ID)
	req.Header.Set(HeaderSignature, Sign(hook.Secret, d.Body))
	resp, err := b.hooks.http.Do(req)
	if err != nil {
		// url.Error names the URL with its query: say what failed only.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, fmt.Errorf("no answer: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return resp.StatusCode, nil
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return resp.StatusCode, fmt.Errorf("answered %d, a redirect (to %q): not followed, only the configured URL is called", resp.StatusCode, redirectHost(resp))
	}
	return resp.StatusCode, fmt.Errorf("answered %d", resp.StatusCode)
}

func redirectHost(resp *http.Response) string {
	if u, err := resp.Location(); err == nil {
		return u.Host
	}
	return ""
}
