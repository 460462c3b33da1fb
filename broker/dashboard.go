package broker

import (
	"context"
	"net/http"

	"github.com/gpupass/gpupass/broker/ui"
)

// DashboardConfig bounds the dashboard's sessions, which each replica
// holds in memory (ui.Config says how each limit acts). Zero takes the
// ui package's default; a negative AdminReserve keeps none.
type DashboardConfig struct {
	MaxSessions        int
	AdminReserve       int
	SessionsPerToken   int
	SessionsPerAddress int
}

// dashboard is the web UI at /ui/. It reads and acts through api, the
// broker's own API handler, with each session's token, and resolves a
// login's token with the lookup every API call uses, so roles and region
// scope are the API's.
func (b *Broker) dashboard(api http.Handler) http.Handler {
	d := b.cfg.Dashboard
	h, err := ui.New(ui.Config{API: api, Log: b.log, MaxSessions: d.MaxSessions, AdminReserve: d.AdminReserve,
		SessionsPerToken: d.SessionsPerToken, SessionsPerAddress: d.SessionsPerAddress, Lookup: func(ctx context.Context, secret string) (ui.Token, error) {
			t, err := b.authenticate(ctx, "Bearer "+secret)
			if err != nil {
				return ui.Token{}, err
			}
			return ui.Token{ID: t.ID, Role: string(t.Role), Regions: t.Regions}, nil
		}})
	if err != nil {
		// The command layer checks the limits before it builds the
		// broker, and the templates are embedded and parsed by the
		// package's tests: a defect, not a condition to serve around.
		panic(err)
	}
	return h
}
