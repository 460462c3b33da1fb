package broker

import (
	"context"
	"fmt"
	"regexp"
	"sync"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/spec"
)

// Bounds of the spec lookup behind ListNodes' spec_fingerprint filter:
// specs kept in memory, and runs read from the store on a miss.
const (
	knownSpecsMax   = 256
	specLookupScope = 1000
)

var specFingerprintRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// knownSpecs are specs this broker parsed, by spec fingerprint: a
// filter by the spec a node is certified for needs the spec, and a
// fingerprint cannot be turned back into one. Bounded; the oldest entry
// goes first.
type knownSpecs struct {
	mu    sync.Mutex
	m     map[string]*spec.Spec
	order []string
}

func (k *knownSpecs) get(fp string) *spec.Spec {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.m[fp]
}

func (k *knownSpecs) put(fp string, sp *spec.Spec) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]*spec.Spec{}
	}
	if _, ok := k.m[fp]; ok {
		return
	}
	if len(k.order) >= knownSpecsMax {
		delete(k.m, k.order[0])
		k.order = k.order[1:]
	}
	k.m[fp] = sp
	k.order = append(k.order, fp)
}

// specByFingerprint returns the spec with fingerprint fp: one this
// broker parsed for a dry run, else the spec of one of the newest runs
// the token may see. A spec neither gave is FAILED_PRECONDITION, saying
// how to make it known.
func (b *Broker) specByFingerprint(ctx context.Context, tok store.Token, fp string) (*spec.Spec, error) {
	if !specFingerprintRE.MatchString(fp) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("spec_fingerprint %q: want sha256: and 64 hex digits (the spec's canonical fingerprint)", fp))
	}
	if sp := b.specs.get(fp); sp != nil {
		return sp, nil
	}
	unknown := connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
		"spec fingerprint %s names no spec this broker holds: dry-run the spec or submit a run of it, then filter again", fp))
	rs, ok := b.store.(store.Runs)
	if !ok {
		return nil, unknown
	}
	allocs, err := rs.ListAllocs(ctx, specLookupScope, func(region string) bool { return match.MatchRegion(tok.Regions, region) })
	if err != nil {
		return nil, b.storeErr("looking up the spec of a fingerprint", err)
	}
	for _, a := range allocs {
		if a.SpecFingerprint != fp {
			continue
		}
		sp, err := spec.Decode(a.SpecJSON)
		if err != nil {
			continue
		}
		// The stored fingerprint is the one computed at submit; the
		// spec is hashed again so a filter never runs on another spec.
		if got, err := spec.Fingerprint(sp); err != nil || got != fp {
			continue
		}
		b.specs.put(fp, sp)
		return sp, nil
	}
	return nil, unknown
}

// certifiedFor reports whether a verdict matched against a spec leaves
// the node certified for it: a report, no failed check, the spec's
// runtime and security. Resources, score, price and liveness are not
// certification (the fingerprint covers none of them).
func certifiedFor(vs *match.Verdicts, v *match.Verdict) bool {
	for _, id := range vs.Why(v) {
		switch vs.Reasons[id].Code {
		case match.CodeNoReport, match.CodeConformanceFailed, match.CodeRuntimeMismatch:
			return false
		}
	}
	return true
}
