package broker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	daemon "github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/command/output"
)

// WebhookAddOptions are the flags of `webhook add`.
type WebhookAddOptions struct {
	DB         string
	URL        string
	SecretFile string
	Regions    string
	Output     output.Format
}

// AddFlags registers webhook add's flags.
func (o *WebhookAddOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.URL, "url", "", "where to POST the events: https://… (or http:// to a loopback host) (required)")
	f.StringVar(&o.SecretFile, "secret-file", "", "file holding the secret the events are signed with (HMAC-SHA256; at least 16 bytes, e.g. openssl rand -hex 32) (required)")
	f.StringVar(&o.Regions, "regions", "*", "the webhook hears of groups with a run in these regions, and of those runs only: comma-separated glob patterns")
}

func newWebhookCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "webhook", Short: "Add, list and remove the webhooks called when a run group ends"}
	ao := &WebhookAddOptions{}
	add := &cobra.Command{
		Use:   "add",
		Short: "Add a webhook: the broker POSTs a signed group.ended event to the URL when every run of a group has ended",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ao.DB, ao.Output = g.DB, g.Output
			return RunWebhookAdd(cmd.Context(), ao, cmd.OutOrStdout())
		},
	}
	ao.AddFlags(add)
	list := &cobra.Command{
		Use: "list", Short: "List webhooks (ids, URLs with query values hidden, regions; never secrets)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return RunWebhookList(cmd.Context(), g.DB, g.Output, cmd.OutOrStdout())
		},
	}
	rm := &cobra.Command{
		Use: "rm WEBHOOK_ID", Short: "Remove a webhook (its deliveries stay on record and are no longer attempted)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return RunWebhookRemove(cmd.Context(), g.DB, args[0], g.Output, cmd.OutOrStdout())
		},
	}
	cmd.AddCommand(add, list, rm)
	return cmd
}

// WebhookDeliveriesOptions are the flags of `webhooks deliveries`.
type WebhookDeliveriesOptions struct {
	DB      string
	Webhook string
	Limit   int
	Output  output.Format
}

// AddFlags registers webhooks deliveries' flags.
func (o *WebhookDeliveriesOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.Webhook, "webhook", "", "only this webhook's deliveries (an id from gpupass-broker webhook list)")
	f.IntVar(&o.Limit, "limit", 50, "newest deliveries to show (1 to 1000)")
}

func newWebhooksCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "webhooks", Short: "What the broker sent to its webhooks"}
	o := &WebhookDeliveriesOptions{}
	deliveries := &cobra.Command{
		Use:   "deliveries",
		Short: "List webhook deliveries, newest first, with every attempt: time, HTTP status or error, duration",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.DB, o.Output = g.DB, g.Output
			return RunWebhookDeliveries(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(deliveries)
	cmd.AddCommand(deliveries)
	return cmd
}

type webhookJSON struct {
	ID      string   `json:"id"`
	URL     string   `json:"url"`
	Regions []string `json:"regions"`
	// SecretSHA256 is the start of the secret's SHA-256: which secret is
	// set, so a receiver's can be compared, without showing it.
	SecretSHA256 string    `json:"secret_sha256"`
	CreatedAt    time.Time `json:"created_at"`
}

func webhookView(w store.Webhook) webhookJSON {
	shown := w.URL
	if u, err := url.Parse(w.URL); err == nil {
		shown = daemon.RedactURL(u)
	}
	sum := sha256.Sum256(w.Secret)
	return webhookJSON{ID: w.ID, URL: shown, Regions: w.Regions, SecretSHA256: hex.EncodeToString(sum[:6]), CreatedAt: w.CreatedAt}
}

func webhookStore(ctx context.Context, db string) (store.Store, store.Webhooks, error) {
	s, err := OpenStore(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	ws, ok := s.(store.Webhooks)
	if !ok {
		s.Close()
		return nil, nil, errors.New("--db: this store keeps no webhooks")
	}
	return s, ws, nil
}

// RunWebhookAdd stores a webhook; the secret is read from its file and
// never printed.
func RunWebhookAdd(ctx context.Context, o *WebhookAddOptions, out io.Writer) error {
	if o.URL == "" {
		return errors.New("--url is required: where to POST the events, https://HOST/PATH")
	}
	if _, err := daemon.CheckWebhookURL(o.URL); err != nil {
		return fmt.Errorf("--url %w", err)
	}
	if o.SecretFile == "" {
		return errors.New("--secret-file is required: a file holding the signing secret (e.g. openssl rand -hex 32 > webhook.secret)")
	}
	secret, err := os.ReadFile(o.SecretFile)
	if err != nil {
		return fmt.Errorf("--secret-file: %w", err)
	}
	regions, err := daemon.ParseRegions(o.Regions)
	if err != nil {
		return fmt.Errorf("--regions: %w", err)
	}
	s, _, err := webhookStore(ctx, o.DB)
	if err != nil {
		return err
	}
	defer s.Close()
	w, err := daemon.AddWebhook(ctx, s, o.URL, secret, regions)
	if err != nil {
		if errors.Is(err, daemon.ErrShortSecret) {
			return fmt.Errorf("--secret-file %s: %w: write a new one with openssl rand -hex 32 > %s", o.SecretFile, err, o.SecretFile)
		}
		return err
	}
	return output.Write(out, o.Output, webhookList{webhookView(w)})
}

// RunWebhookList lists webhooks without secrets.
func RunWebhookList(ctx context.Context, db string, format output.Format, out io.Writer) error {
	s, ws, err := webhookStore(ctx, db)
	if err != nil {
		return err
	}
	defer s.Close()
	hooks, err := ws.ListWebhooks(ctx)
	if err != nil {
		return err
	}
	list := webhookList{}
	for _, w := range hooks {
		list = append(list, webhookView(w))
	}
	return output.Write(out, format, list)
}

// webhookList is what `webhook list` and `add` print (never a secret).
type webhookList []webhookJSON

func (l webhookList) WriteText(out io.Writer) error {
	if len(l) == 0 {
		_, err := fmt.Fprintln(out, "no webhooks (add one with gpupass-broker webhook add --url URL --secret-file FILE)")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tURL\tREGIONS\tSECRET SHA256\tCREATED")
	for _, w := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s…\t%s\n", w.ID, w.URL, strings.Join(w.Regions, ","), w.SecretSHA256, w.CreatedAt.Format(time.RFC3339))
	}
	return tw.Flush()
}

// RunWebhookRemove deletes a webhook.
func RunWebhookRemove(ctx context.Context, db, id string, format output.Format, out io.Writer) error {
	s, ws, err := webhookStore(ctx, db)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := ws.DeleteWebhook(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("no webhook %s (see gpupass-broker webhook list)", id)
		}
		return err
	}
	return output.Write(out, format, webhookRemoved{Removed: id})
}

// webhookRemoved is what `webhook rm` prints: with -o json, JSON only.
type webhookRemoved struct {
	Removed string `json:"removed"`
}

func (r webhookRemoved) WriteText(out io.Writer) error {
	_, err := fmt.Fprintf(out, "removed %s\n", r.Removed)
	return err
}

type attemptJSON struct {
	N          int       `json:"n"`
	At         time.Time `json:"at"`
	Status     int       `json:"status"`
	Error      string    `json:"error,omitempty"`
	DurationMS int64     `json:"duration_ms"`
}

type deliveryJSON struct {
	ID       string        `json:"id"`
	Webhook  string        `json:"webhook"`
	Group    string        `json:"group"`
	Event    string        `json:"event"`
	State    string        `json:"state"`
	NextAt   *time.Time    `json:"next_attempt_at,omitempty"`
	Created  time.Time     `json:"created_at"`
	Attempts []attemptJSON `json:"attempts"`
}

// RunWebhookDeliveries lists deliveries with their attempts.
func RunWebhookDeliveries(ctx context.Context, o *WebhookDeliveriesOptions, out io.Writer) error {
	if o.Limit < 1 || o.Limit > 1000 {
		return fmt.Errorf("--limit %d: give 1 to 1000", o.Limit)
	}
	s, ws, err := webhookStore(ctx, o.DB)
	if err != nil {
		return err
	}
	defer s.Close()
	ds, err := ws.Deliveries(ctx, o.Webhook, o.Limit)
	if err != nil {
		return err
	}
	list := deliveryList{}
	for _, d := range ds {
		v := deliveryJSON{ID: d.ID, Webhook: d.WebhookID, Group: d.Group, Event: d.Event, State: d.State, Created: d.Created, Attempts: []attemptJSON{}}
		if d.State == store.DeliveryPending {
			v.NextAt = &d.NextAt
		}
		for _, a := range d.Log {
			v.Attempts = append(v.Attempts, attemptJSON{N: a.N, At: a.At, Status: a.Status, Error: a.Error, DurationMS: a.Duration.Milliseconds()})
		}
		list = append(list, v)
	}
	return output.Write(out, o.Output, list)
}

type deliveryList []deliveryJSON

func (l deliveryList) WriteText(out io.Writer) error {
	if len(l) == 0 {
		_, err := fmt.Fprintln(out, "no deliveries")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DELIVERY\tWEBHOOK\tGROUP\tSTATE\tATTEMPT\tAT\tSTATUS\tDURATION\tERROR")
	for _, d := range l {
		if len(d.Attempts) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t-\t-\t-\t\n", d.ID, d.Webhook, d.Group, d.State)
		}
		for _, a := range d.Attempts {
			status := "-"
			if a.Status != 0 {
				status = fmt.Sprint(a.Status)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%dms\t%s\n", d.ID, d.Webhook, d.Group, d.State, a.N, a.At.Format(time.RFC3339), status, a.DurationMS, a.Error)
		}
	}
	return tw.Flush()
}
