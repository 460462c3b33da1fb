package auditcmd

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/brokerrpc"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// defaultOut is --out left as it is (and the CI inputs' default): for a
// run group it stands for the directory audit-GROUP.
const defaultOut = "audit-report.zip"

// GroupOut is where `gpupass audit GROUP` writes its zips: the directory
// --out names, or audit-GROUP when --out is left at its default.
func GroupOut(group, out string) string {
	if out == "" || out == defaultOut {
		return "audit-" + group
	}
	return out
}

// groupZip is one run of an audited group: where its zip went and what
// the zip proves (the same Result a per-run audit prints).
type groupZip struct {
	Region string `json:"region"`
	// Skipped says why a run has no zip: it ended before it started, so
	// nothing ran and there is nothing to prove (audit ALLOC refuses it).
	Skipped           string `json:"skipped,omitempty"`
	SkippedAllocation string `json:"skipped_allocation_id,omitempty"`
	*AuditResult
}

// groupWritten is what `gpupass audit GROUP` prints: as JSON, a list.
type groupWritten []groupZip

func (g groupWritten) WriteText(out io.Writer) error {
	var b strings.Builder
	for _, z := range g {
		if z.AuditResult == nil {
			fmt.Fprintf(&b, "no zip for run %s in %s: %s\n", z.SkippedAllocation, z.Region, z.Skipped)
			continue
		}
		if z.Simulated {
			fmt.Fprintf(&b, "!!! SIMULATED: run %s used a simulated hardware profile; its report proves nothing about real hardware !!!\n", z.AllocationID)
		}
		fmt.Fprintf(&b, "wrote %s: run %s in %s, %d files, manifest sha256 %s, signed with %s\n", z.Path, z.AllocationID, z.Region, z.Files, z.ManifestSHA256, z.Signing)
		if !z.Match {
			fmt.Fprintf(&b, "note: %s: the measured environment fingerprint differs from the declared one; verify will fail the fingerprint layer\n", z.Path)
		}
		if z.LogProblem != "" {
			fmt.Fprintf(&b, "note: %s: %s; verify will fail the log layer\n", z.Path, z.LogProblem)
		}
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// summary is the CI step's summary of a group's audit: the zips written
// into dir and, signed keyless, who signed (one identity signs every
// run's zip: the job's) and the command that verifies the directory.
func (g groupWritten) summary(group, dir, trustedRoot string) string {
	n, simulated := 0, false
	var sb *audit.SignedBy
	for _, z := range g {
		if z.AuditResult == nil {
			continue
		}
		n++
		simulated = simulated || z.Simulated
		if sb == nil && z.SignedBy != nil {
			sb = z.SignedBy
		}
	}
	wrote := fmt.Sprintf("Wrote %d signed zip(s) of run group `%s` into `%s`.", n, group, dir)
	return auditSummary(wrote, simulated, sb, dir, trustedRoot)
}

// signedBy is who signed the group's zips keyless (one identity signs
// them all: the job's); nil when a key signed.
func (g groupWritten) signedBy() *audit.SignedBy {
	for _, z := range g {
		if z.AuditResult != nil && z.SignedBy != nil {
			return z.SignedBy
		}
	}
	return nil
}

// mode is how the group's zips were signed (audit.ModeKey or ModeKeyless).
func (g groupWritten) mode() string {
	for _, z := range g {
		if z.AuditResult != nil {
			return z.Signing
		}
	}
	return ""
}

// groupPrinted is groupWritten with, for a group signed keyless, the
// command that verifies the whole directory; as JSON, the list alone.
type groupPrinted struct {
	zips groupWritten
	// dir is --out; trustedRoot --trusted-root, named in the command.
	dir, trustedRoot string
}

func (g groupPrinted) WriteJSON(w io.Writer) error { return output.WriteJSON(w, g.zips) }

func (g groupPrinted) WriteText(w io.Writer) error {
	if err := g.zips.WriteText(w); err != nil {
		return err
	}
	for _, z := range g.zips {
		// One identity signs every run's zip: the job's.
		if z.AuditResult != nil && z.SignerIdentity != "" {
			_, err := io.WriteString(w, keylessVerify(g.dir, z.SignerIdentity, z.SignerIssuer, g.trustedRoot))
			return err
		}
	}
	return nil
}

// groupZipNames names each run's zip by its region, adding the
// allocation id where a region holds more than one run of the group.
// The names come from the broker: a region or an id that is not plain
// lowercase letters, digits and '-' is refused rather than joined into a
// path (a "../" would write outside --out).
func groupZipNames(runs []*gpupassv1.Run) ([]string, error) {
	per := map[string]int{}
	for _, r := range runs {
		if err := api.CheckRegion(r.GetRegion()); err != nil {
			return nil, fmt.Errorf("the broker named run %q's region: %w", r.GetId(), err)
		}
		if id := r.GetId(); id == "" || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return nil, fmt.Errorf("the broker named a run %q: not an allocation id", id)
		}
		per[r.GetRegion()]++
	}
	names := make([]string, len(runs))
	for i, r := range runs {
		names[i] = "audit-" + r.GetRegion() + ".zip"
		if per[r.GetRegion()] > 1 {
			names[i] = "audit-" + r.GetRegion() + "-" + r.GetId() + ".zip"
		}
	}
	return names, nil
}

// auditGroup writes one signed zip per run of a run group, each by the
// per-run audit (auditOne), into a directory. Every run must have ended
// before anything is written: a group's reports are read as a set. A
// group none of whose runs the token can read is answered as an unknown
// one (brokerrpc.GroupRuns), so that nothing is said of other tokens'
// groups.
func (o AuditOptions) auditGroup(ctx context.Context) (groupWritten, error) {
	group := o.AllocationID
	if err := api.CheckGroupID(group); err != nil {
		return nil, &gpupass.ExitError{Code: gpupass.ExitUsage, Err: err}
	}
	outFlag := gpupass.CIFlag(o.Output, "out")
	if o.RunFile != "" {
		return nil, &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("audit %s: %s is one run's record; a run group is read from the broker: leave out %s", group, gpupass.CIFlag(o.Output, "run-file"), gpupass.CIFlag(o.Output, "run-file"))}
	}
	dir := GroupOut(group, o.Out)
	if strings.HasSuffix(dir, ".zip") {
		return nil, &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("audit %s: %s %s names one zip, and a run group gets one zip per run: name a directory (%s audit-%s), or leave it out for audit-%s", group, outFlag, dir, outFlag, group, group)}
	}
	c, err := o.Broker.DialRuns()
	if err != nil {
		return nil, err
	}
	runs, err := brokerrpc.GroupRuns(ctx, c, group)
	if err != nil {
		return nil, err
	}
	var going []string
	for _, r := range runs {
		if !runview.Terminal(r.GetState()) {
			going = append(going, fmt.Sprintf("%s in %s (%s)", r.GetId(), r.GetRegion(), runview.State(r.GetState())))
		}
	}
	if len(going) > 0 {
		return nil, gpupass.Findings(fmt.Errorf("audit %s: %w: %d of its %d runs have not ended: %s; nothing was written: audit the group after they end (gpupass wait %s waits for them)",
			group, audit.ErrInProgress, len(going), len(runs), strings.Join(going, ", "), termsafe.ShellQuote(group)))
	}
	// A run that ended before it started ran nothing: it has no zip (as
	// audit ALLOC refuses it) and the output says so.
	var audited []*gpupassv1.Run
	written := make(groupWritten, 0, len(runs))
	for _, r := range runs {
		if r.GetStartedUnixNano() == 0 {
			written = append(written, groupZip{Region: r.GetRegion(), SkippedAllocation: r.GetId(),
				Skipped: fmt.Sprintf("it ended before it started (%s): nothing ran, so there is nothing to audit", runview.State(r.GetState()))})
			continue
		}
		audited = append(audited, r)
	}
	if len(audited) == 0 {
		return nil, &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("audit %s: every run of the group ended before it started: nothing ran, so there is nothing to audit; gpupass runs --group %s lists them", group, termsafe.ShellQuote(group))}
	}
	names, err := groupZipNames(audited)
	if err != nil {
		return nil, fmt.Errorf("audit %s: %w", group, err)
	}
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return nil, &gpupass.ExitError{Code: gpupass.ExitUsage, Err: fmt.Errorf("audit %s: %s %s is a file: name a directory for the group's zips", group, outFlag, dir)}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("audit %s: %w", group, err)
	}
	// Every report carries, signed, the whole group as listed here:
	// audit verify DIR then knows a report taken out of the set.
	listing := &audit.ManifestGroup{ID: group}
	for _, r := range runs {
		listing.Runs = append(listing.Runs, audit.ManifestGroupRun{AllocationID: r.GetId(), Region: r.GetRegion(), Audited: r.GetStartedUnixNano() != 0})
	}
	for i, r := range audited {
		one := o
		one.group = listing
		one.AllocationID, one.Out = r.GetId(), filepath.Join(dir, names[i])
		res, err := one.auditOne(ctx)
		if err != nil {
			if i > 0 {
				err = fmt.Errorf("%w (the zips of the %d runs before it were written into %s)", err, i, dir)
			}
			return nil, fmt.Errorf("audit %s: run %s in %s: %w", group, r.GetId(), r.GetRegion(), err)
		}
		written = append(written, groupZip{Region: r.GetRegion(), AuditResult: res})
	}
	return written, nil
}

// checkGroup holds a set of verified reports to the run group their
// signed manifests name: every report of one group names the same runs,
// and every run of it that has a report has exactly one here. A set
// with no group (reports of single runs) is not checked. The text and
// JSON output say what was found (groupCheck).
func (s verifiedSet) checkGroup() error {
	var g *audit.ManifestGroup
	var from string
	var outside []string // verified reports of no group
	have := map[string]int{}
	for _, v := range s {
		if v.Result == nil || !v.Result.OK {
			continue // failed already, named by failed()
		}
		if v.Result.Group == nil {
			outside = append(outside, v.File)
			continue
		}
		if g == nil {
			g, from = v.Result.Group, v.File
		} else if !reflect.DeepEqual(g, v.Result.Group) {
			return fmt.Errorf("%s and %s name different run groups or runs (%s, %s): verify each group's reports apart", from, v.File, g.ID, v.Result.Group.ID)
		}
		have[v.Result.AllocationID]++
	}
	if g == nil {
		return nil
	}
	if len(outside) > 0 {
		return fmt.Errorf("%s: not a report of run group %s, as %s is: verify each group's reports apart", strings.Join(outside, ", "), g.ID, from)
	}
	var missing, twice []string
	audited := 0
	for _, r := range g.Runs {
		if !r.Audited {
			continue
		}
		audited++
		switch have[r.AllocationID] {
		case 0:
			missing = append(missing, r.AllocationID+" ("+r.Region+")")
		case 1:
		default:
			twice = append(twice, r.AllocationID)
		}
	}
	switch {
	case len(missing) > 0:
		return fmt.Errorf("run group %s: %d of its %d audited runs have no report here: %s (the reports' signed manifests list the group's runs)", g.ID, len(missing), audited, strings.Join(missing, ", "))
	case len(twice) > 0:
		return fmt.Errorf("run group %s: more than one report of %s here", g.ID, strings.Join(twice, ", "))
	}
	return nil
}
