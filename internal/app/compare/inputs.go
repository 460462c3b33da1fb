package compare

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/metrics"
)

type input struct {
	label, ref string
	price      float64
}

// ErrNothing is Options.Runs left empty.
var ErrNothing = errors.New("nothing to compare: give metric files or allocation ids")

// resolveInputs pairs each input with its name and price; a Ref given
// twice is one run, which may have one name.
func resolveInputs(runs []Input, prices []Price) ([]input, error) {
	var ins []input
	index := map[string]int{}
	named := map[string]bool{}
	for _, r := range runs {
		if r.Ref == "" {
			return nil, fielderr.New("Runs", r.Name+"=", "no file or allocation id")
		}
		i, ok := index[r.Ref]
		if !ok {
			ins = append(ins, input{ref: r.Ref})
			i = len(ins) - 1
			index[r.Ref] = i
		}
		if r.Name == "" {
			continue
		}
		if named[r.Name] {
			return nil, fielderr.New("Runs", r.Name+"="+r.Ref, "the name %q is given twice; each run needs its own", r.Name)
		}
		if prev := ins[i].label; prev != "" {
			// One run under two names would be compared once, under the
			// last: the report would lack a run the caller asked for.
			return nil, fielderr.New("Runs", r.Name+"="+r.Ref, "the names %q and %q are given to the same run %s; give each name a run of its own", prev, r.Name, r.Ref)
		}
		named[r.Name] = true
		ins[i].label = r.Name
	}
	if len(ins) == 0 {
		return nil, ErrNothing
	}
	for _, p := range prices {
		if p.PerHour < 0 {
			return nil, fielderr.New("Prices", p.Name, "a price must not be negative")
		}
		found := false
		for i := range ins {
			if ins[i].label == p.Name || (ins[i].label == "" && defaultLabel(ins[i].ref) == p.Name) {
				ins[i].price, found = p.PerHour, true
			}
		}
		if !found {
			return nil, fielderr.New("Prices", p.Name, "no run named %q", p.Name)
		}
	}
	return ins, nil
}

// NeedsSource says whether some run is an allocation id rather than a
// file, so the caller knows to find the broker.
func NeedsSource(runs []Input) bool {
	for _, r := range runs {
		if _, err := os.Stat(r.Ref); err != nil && (LooksLikeAlloc(r.Ref) || LooksLikeGroup(r.Ref)) {
			return true
		}
	}
	return false
}

// defaultLabel names a file run: the file name without extension, or the
// directory name when the file name is a logger default (metrics.csv,
// events.out.tfevents.*).
func defaultLabel(ref string) string {
	base := filepath.Base(ref)
	stem := strings.TrimSuffix(base, filepath.Ext(base))
	switch {
	case strings.HasPrefix(base, "events.out.tfevents"), stem == "metrics", stem == "train", stem == "loss", stem == "log":
		if d := filepath.Base(filepath.Dir(ref)); d != "." && d != "/" {
			return d
		}
	}
	return stem
}

// disambiguate names allocations that share their default label (two runs
// in one region) by region and id; explicit names and file labels are
// left alone, so a clash there stays an error that names the fix.
func disambiguate(ins []input, series []*metrics.Series) {
	count := map[string]int{}
	for _, s := range series {
		count[s.Label]++
	}
	for i, s := range series {
		if ins[i].label == "" && count[s.Label] > 1 && LooksLikeAlloc(ins[i].ref) && s.Label != ins[i].ref {
			s.Label += " " + ins[i].ref
		}
	}
}

// LooksLikeGroup says whether ref is a run group id (as train prints it)
// rather than a path.
func LooksLikeGroup(ref string) bool { return api.CheckGroupID(ref) == nil }

// GroupSource is a Source that also knows run groups: a group id among
// the inputs stands for its runs, each labelled by its region as an
// allocation id is.
type GroupSource interface {
	GroupRuns(ctx context.Context, group string) (allocIDs []string, err error)
}

// expandGroups replaces each run group id among runs (one that is no
// file) by its runs' allocation ids. A group has no one name: a named
// one is refused with the way to name its runs.
func expandGroups(ctx context.Context, runs []Input, src Source) ([]Input, error) {
	var out []Input
	for _, r := range runs {
		if _, err := os.Stat(r.Ref); err == nil || !LooksLikeGroup(r.Ref) {
			out = append(out, r)
			continue
		}
		if r.Name != "" {
			return nil, fielderr.New("Runs", r.Name+"="+r.Ref, "a run group stands for several runs, each labelled by its region: pass %s without a name, or name each run by its allocation id (gpupass runs --group %s lists them)", r.Ref, r.Ref)
		}
		gs, ok := src.(GroupSource)
		if !ok {
			return nil, fmt.Errorf("%s: %w", r.Ref, ErrNoSource)
		}
		ids, err := gs.GroupRuns(ctx, r.Ref)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			out = append(out, Input{Ref: id})
		}
	}
	return out, nil
}

// LooksLikeAlloc says whether ref is an allocation id rather than a path.
func LooksLikeAlloc(ref string) bool {
	return strings.HasPrefix(ref, "alloc-") && !strings.ContainsAny(ref, `/\.`)
}
