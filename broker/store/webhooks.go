package store

import (
	"context"
	"time"
)

// Webhook is a destination the broker calls when a run group ends: set
// up by an operator (gpupass-broker webhook add), never by a submitter,
// so the broker only ever calls the URLs stored here.
type Webhook struct {
	ID  string
	URL string
	// Secret keys the HMAC-SHA256 signature of every delivery. It is kept
	// as given (the broker must sign with it), like the database's other
	// secrets protected by the store's access rules; it is never listed.
	Secret []byte
	// Regions scope the webhook as a token's do: it hears of a group with
	// a run in them, and of those runs only.
	Regions   []string
	CreatedAt time.Time
}

// EndedGroup is a run group all of whose runs have ended.
type EndedGroup struct {
	ID string
	// LastUpdate is when its runs were last written: when it ended.
	LastUpdate time.Time
}

// Delivery states.
const (
	DeliveryPending   = "pending"   // an attempt is due at NextAt
	DeliveryDelivered = "delivered" // an attempt was answered 2xx
	DeliveryFailed    = "failed"    // the attempts ran out
)

// Delivery is one event sent to one webhook, with its attempts.
type Delivery struct {
	ID        string
	WebhookID string
	Group     string
	Event     string
	// Body is the exact JSON signed and sent, fixed when the group ended
	// so that every attempt sends the same bytes.
	Body     []byte
	State    string
	Attempts int
	NextAt   time.Time
	Created  time.Time
	// Log holds the attempts, oldest first (filled by Deliveries only).
	Log []Attempt
}

// Attempt is one try of a delivery.
type Attempt struct {
	N        int
	At       time.Time
	Status   int    // HTTP status; 0 when no answer came
	Error    string // why it failed; empty for a 2xx
	Duration time.Duration
}

// Webhooks is the persistence of webhook destinations and deliveries.
// The SQL backends implement it next to Store.
type Webhooks interface {
	CreateWebhook(ctx context.Context, w Webhook) error
	// ListWebhooks returns every webhook, oldest first.
	ListWebhooks(ctx context.Context) ([]Webhook, error)
	// DeleteWebhook removes a webhook (ErrNotFound when there is none);
	// its deliveries stay, for the record, and are no longer attempted.
	DeleteWebhook(ctx context.Context, id string) error
	// EndedGroups returns groups that hold their GroupSize runs, every
	// one terminal, and one of whose runs was updated in (since, until]:
	// the groups that ended in that window (and maybe a few that ended
	// before; callers dedupe by CreateDelivery). At most limit, in the
	// order they ended: a caller given a full page goes on from the last
	// one's LastUpdate.
	EndedGroups(ctx context.Context, since, until time.Time, limit int) ([]EndedGroup, error)
	// CreateDelivery stores d unless its webhook already has a delivery
	// for d.Group (then it returns false): once per group and webhook,
	// however many replicas notice the group ended.
	CreateDelivery(ctx context.Context, d Delivery) (bool, error)
	// DueDeliveries returns pending deliveries of existing webhooks with
	// NextAt <= now, oldest due first, at most limit.
	DueDeliveries(ctx context.Context, now time.Time, limit int) ([]Delivery, error)
	// ClaimDelivery moves a pending delivery's NextAt from seen to until
	// when it is still seen: the caller alone makes the attempt (another
	// replica's claim of the same read fails).
	ClaimDelivery(ctx context.Context, id string, seen, until time.Time) (bool, error)
	// FinishAttempt records attempt a of d and sets d's State, Attempts
	// and NextAt.
	FinishAttempt(ctx context.Context, d Delivery, a Attempt) error
	// Deliveries returns the newest deliveries (of webhookID; "": of
	// all) with their attempts, at most limit.
	Deliveries(ctx context.Context, webhookID string, limit int) ([]Delivery, error)
}
