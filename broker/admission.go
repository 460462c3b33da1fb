package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// Node admission. Any holder of an agent token can enroll a node into the
// token's regions, and a node that declares a low price wins placement.
// Where a region's admission is "approve", a node the broker has not seen
// approved is pending: listed, with the reason and the command that
// admits it, but given no run until an admin approves it. Decisions are
// stored (store.Admissions) and shared by replicas; the policy is each
// replica's --admission flag, so give every replica the same one.

// AdmissionMode is how a region admits newly enrolled nodes.
type AdmissionMode string

// Admission modes.
const (
	// AdmissionOpen admits every node an agent token enrolls (the
	// default: existing fleets, gpupass up and the demo keep working).
	AdmissionOpen AdmissionMode = "open"
	// AdmissionApprove holds every node until an admin approves it.
	AdmissionApprove AdmissionMode = "approve"
)

// AdmissionRule sets the mode of the regions matching Pattern (a glob,
// as in token scopes).
type AdmissionRule struct {
	Pattern string
	Mode    AdmissionMode
}

// The admission a node has now, as ListNodes shows it.
const (
	admitted = "admitted"
	pending  = "pending"
	denied   = "denied"
)

// ParseAdmission reads --admission: comma-separated rules
// "PATTERN=MODE", or a bare MODE for every region, e.g.
// "eu-*=approve,us-east-1=approve" or "approve". The first rule whose
// pattern matches a region decides; a region no rule matches is open.
func ParseAdmission(s string) ([]AdmissionRule, error) {
	var out []AdmissionRule
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		pat, mode, ok := strings.Cut(item, "=")
		if !ok {
			pat, mode = "*", item
		}
		pat, mode = strings.TrimSpace(pat), strings.TrimSpace(mode)
		if err := api.CheckRegionPattern(pat); err != nil {
			return nil, fmt.Errorf("%q: %w", item, err)
		}
		switch m := AdmissionMode(mode); m {
		case AdmissionOpen, AdmissionApprove:
			out = append(out, AdmissionRule{Pattern: pat, Mode: m})
		default:
			return nil, fmt.Errorf("%q: mode %q is not open or approve (e.g. 'eu-*=approve' or 'approve')", item, mode)
		}
	}
	return out, nil
}

// admissionMode is the mode of region under the broker's rules.
func (b *Broker) admissionMode(region string) AdmissionMode {
	for _, r := range b.cfg.Admission {
		if ok, _ := path.Match(r.Pattern, region); ok {
			return r.Mode
		}
	}
	return AdmissionOpen
}

func (b *Broker) approvesAny() bool {
	for _, r := range b.cfg.Admission {
		if r.Mode == AdmissionApprove {
			return true
		}
	}
	return false
}

// approveHint is the command that admits node id, for the broker's own
// log, which its operator reads; a reason an API client receives names
// no command (the CLI adds it to the reasons it prints).
func approveHint(id string) string { return "gpupass nodes approve " + id }

// admissionOf is a node's admission given the stored decisions.
func (b *Broker) admissionOf(id, region string, decided map[string]store.Admission) (state string, why match.Reason) {
	a, ok := decided[id]
	if ok && a.Region == region {
		if a.State == store.AdmissionDenied {
			return denied, match.Reason{Code: match.CodeAdmission, Field: "admission", Expected: admitted, Measured: denied,
				Message: fmt.Sprintf("denied admission by %s at %s", a.DecidedBy, a.DecidedAt.UTC().Format(time.RFC3339))}
		}
		return admitted, match.Reason{}
	}
	if b.admissionMode(region) == AdmissionOpen {
		return admitted, match.Reason{}
	}
	msg := "pending admission (region " + region + " admits nodes by approval)"
	if ok {
		msg = fmt.Sprintf("pending admission: approved for region %s, now enrolled in %s", a.Region, region)
	}
	return pending, match.Reason{Code: match.CodeAdmission, Field: "admission", Expected: admitted, Measured: pending, Message: msg}
}

// readAdmissions brings s's decisions up to date: all of them on a full
// read (old nil), else those decided since old was read. read says
// whether it read any (then held nodes must be worked out again).
func (b *Broker) readAdmissions(ctx context.Context, s, old *snapshot) (read bool, err error) {
	as, ok := b.store.(store.Admissions)
	if !ok {
		return false, nil
	}
	var since time.Time
	if old != nil {
		s.decided = old.decided
		since = old.at.Add(-refreshMargin)
	}
	got, err := as.Admissions(ctx, since)
	if err != nil {
		return false, err
	}
	if len(got) > 0 {
		s.decided = maps.Clone(s.decided)
		if s.decided == nil {
			s.decided = map[string]store.Admission{}
		}
		for _, a := range got {
			s.decided[a.AgentID] = a
		}
	}
	return len(got) > 0, nil
}

// decided are the admission decisions this replica holds, for Enroll's
// log line: the snapshot it has, not a fresh read. Enroll has just
// invalidated the snapshot, so a refresh there would make every
// enrollment in an approve region (a whole fleet, after a restart) wait
// for a registry read and re-index, for a log line.
func (b *Broker) decided(ctx context.Context) map[string]store.Admission {
	b.snapMu.Lock()
	s := b.snap
	b.snapMu.Unlock()
	if s == nil {
		var err error
		if s, err = b.snapshot(ctx); err != nil {
			return nil
		}
	}
	return s.decided
}

// holdNodes sets s.held: the nodes that may take no run, with why.
func (b *Broker) holdNodes(s *snapshot) {
	s.held = nil
	if !b.approvesAny() && len(s.decided) == 0 {
		return
	}
	// Nodes without a decision in an open region (most, in a fleet that
	// approves a few regions) are admitted: the rules are matched once
	// per region, not per node.
	open := map[string]bool{}
	for i := range s.nodes {
		n := &s.nodes[i]
		region := match.Region(n)
		if _, ok := s.decided[n.ID]; !ok {
			o, seen := open[region]
			if !seen {
				o = b.admissionMode(region) == AdmissionOpen
				open[region] = o
			}
			if o {
				continue
			}
		}
		if _, why := b.admissionOf(n.ID, region, s.decided); why.Code != "" {
			if s.held == nil {
				s.held = map[string]match.Reason{}
			}
			s.held[n.ID] = why
		}
	}
}

// nodeAdmission is what ListNodes says of node n.
func (s *snapshot) nodeAdmission(id string) string {
	if why, ok := s.held[id]; ok {
		return why.Measured
	}
	return admitted
}

// SetAdmission records an admin's decision on a node (NodeService).
func (s *nodeService) SetAdmission(ctx context.Context, req *connect.Request[gpupassv1.SetAdmissionRequest]) (*connect.Response[gpupassv1.SetAdmissionResponse], error) {
	b := s.b
	tok, _ := TokenFrom(ctx)
	as, ok := b.store.(store.Admissions)
	if !ok {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this broker's store keeps no admission decisions"))
	}
	var state store.AdmissionState
	switch d := req.Msg.Decision; d {
	case "approve":
		state = store.AdmissionApproved
	case "deny":
		state = store.AdmissionDenied
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("decision %q: want approve or deny", d))
	}
	id := strings.TrimSpace(req.Msg.NodeId)
	a, err := b.store.Agent(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && checkRegion(tok, a.Labels.Region) != nil) {
		// A node outside the token's scope is not shown to it either.
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no node %s in the scope of token %s (%s)", id, tok.ID, strings.Join(tok.Regions, ",")))
	}
	if err != nil {
		b.log.Error("reading agent", "agent", id, "err", err)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("registry unavailable"))
	}
	// The region the node is listed and matched in (its last report's),
	// which is what the admin saw.
	snap, err := b.snapshot(ctx)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("registry unavailable"))
	}
	region := a.Labels.Region
	if i, ok := snap.pos[a.ID]; ok {
		region = match.Region(&snap.nodes[i])
	}
	if checkRegion(tok, region) != nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no node %s in the scope of token %s (%s)", id, tok.ID, strings.Join(tok.Regions, ",")))
	}
	if err := as.SetAdmission(ctx, store.Admission{AgentID: a.ID, Region: region, State: state, DecidedBy: tok.ID, DecidedAt: time.Now().UTC()}); err != nil {
		b.log.Error("storing admission", "agent", a.ID, "err", err)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("storing the decision failed"))
	}
	b.invalidate()
	b.log.Info("node admission decided", "agent", a.ID, "region", region, "decision", req.Msg.Decision, "token", tok.ID)
	snap, err = b.snapshot(ctx)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("registry unavailable"))
	}
	return connect.NewResponse(&gpupassv1.SetAdmissionResponse{NodeId: a.ID, Region: region, Admission: snap.nodeAdmission(a.ID)}), nil
}

// sameHeld reports whether a and b hold the same nodes for the same
// reasons (then an index's class means stand).
func sameHeld(a, b map[string]match.Reason) bool { return maps.Equal(a, b) }
