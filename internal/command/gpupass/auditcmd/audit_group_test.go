package auditcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/testutil"
)

// Issue #35: `gpupass audit GROUP` writes one complete signed zip per run
// of the group, named by region, each verifying on its own and together
// (audit verify DIR); while a run of the group still runs nothing is
// written and the running run and gpupass wait GROUP are named; a token
// that reads none of the group's runs gets the unknown group's answer.
func TestAuditGroupWritesOneZipPerRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, getenv := auditFixture(t)
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	ls := brokertest.StartGroup(t, b, "us-west-2", "ap-south-1")
	group := ls[0].Run.Group
	if group == "" || ls[1].Run.Group != group {
		t.Fatalf("runs in groups %q and %q, want one group", ls[0].Run.Group, ls[1].Run.Group)
	}
	reader := gpupass.BrokerFlags{URL: b.URL, Token: b.Token(t, store.RoleRead, "us-west-2", "ap-south-1")}
	out := filepath.Join(dir, "reports")
	opts := AuditOptions{AllocationID: group, Out: out, Key: filepath.Join(dir, "cosign.key"), Broker: reader, Getenv: getenv, Output: output.JSON}

	// One run ended, one still running: refused, nothing written.
	ls[0].Update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, 0)
	var buf bytes.Buffer
	err := RunAudit(ctx, opts, &buf)
	for _, want := range []string{"1 of its 2 runs have not ended", ls[1].Run.Id + " in ap-south-1 (running)", "gpupass wait " + group} {
		if gpupass.ExitCode(err) != gpupass.ExitFindings || !strings.Contains(err.Error(), want) {
			t.Fatalf("audit of a group with a running run: exit %d, %v; want exit 1 saying %q", gpupass.ExitCode(err), err, want)
		}
	}
	if strings.Contains(err.Error(), ls[0].Run.Id) {
		t.Errorf("the refusal names the run that ended: %v", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("audit of a running group wrote its directory")
	}

	ls[1].Update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, 0)
	buf.Reset()
	if err := RunAudit(ctx, opts, &buf); err != nil {
		t.Fatalf("audit %s: %v", group, err)
	}
	var got []struct {
		Region string `json:"region"`
		AuditResult
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("audit GROUP -o json is not a list: %v\n%s", err, buf.String())
	}
	type zipOf struct{ Path, Alloc, Region, Signing string }
	var zips []zipOf
	for _, z := range got {
		zips = append(zips, zipOf{z.Path, z.AllocationID, z.Region, z.Signing})
		if len(z.ManifestSHA256) != 64 || !z.Match {
			t.Errorf("zip %s: manifest sha256 %q, fingerprint match %v", z.Path, z.ManifestSHA256, z.Match)
		}
	}
	want := []zipOf{
		{filepath.Join(out, "audit-us-west-2.zip"), ls[0].Run.Id, "us-west-2", "key"},
		{filepath.Join(out, "audit-ap-south-1.zip"), ls[1].Run.Id, "ap-south-1", "key"},
	}
	if diff := cmp.Diff(want, zips); diff != "" {
		t.Fatalf("audit GROUP wrote (-want +got):\n%s", diff)
	}

	// Text: each zip, its run, region and digest.
	topts := opts
	topts.Output, topts.Out = output.Text, filepath.Join(dir, "text")
	buf.Reset()
	if err := RunAudit(ctx, topts, &buf); err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		line := "wrote " + filepath.Join(dir, "text", "audit-"+l.Run.Region+".zip") + ": run " + l.Run.Id + " in " + l.Run.Region + ", "
		if !strings.Contains(buf.String(), line) || !strings.Contains(buf.String(), "manifest sha256 ") {
			t.Errorf("text output lacks %q:\n%s", line, buf.String())
		}
	}

	// Each zip verifies alone, pinned to its node's key, as a per-run
	// audit's does; the directory verifies as a whole.
	var agentKeys []string
	for i, l := range ls {
		pem, err := conformance.PublicKeyPEM(l.Agent.Key)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, l.Run.Region+".pub")
		if err := os.WriteFile(p, pem, 0o644); err != nil {
			t.Fatal(err)
		}
		agentKeys = append(agentKeys, p)
		var vout bytes.Buffer
		v := AuditVerifyOptions{Path: want[i].Path, Key: filepath.Join(dir, "cosign.pub"), AgentKeys: []string{p}, RequirePinned: true, Getenv: getenv}
		if err := RunAuditVerify(ctx, v, &vout); err != nil || !strings.HasSuffix(vout.String(), "verified "+want[i].Path+" (allocation "+l.Run.Id+")\n"+
			"one of the 2 runs of run group "+group+": verify the directory of its reports to check the whole group\n") {
			t.Fatalf("verify %s alone: %v\n%s", want[i].Path, err, vout.String())
		}
	}
	verifyDir := AuditVerifyOptions{Path: out, Key: filepath.Join(dir, "cosign.pub"), AgentKeys: agentKeys, RequirePinned: true, Getenv: getenv}
	var vout bytes.Buffer
	if err := RunAuditVerify(ctx, verifyDir, &vout); err != nil || !strings.HasSuffix(vout.String(), "\nverified all 2 audit reports\n"+
		"run group "+group+": every audited run has its report here (2 of 2 runs)\n") {
		t.Fatalf("verify %s: %v\n%s", out, err, vout.String())
	}

	// The reports carry the group's runs, signed: a directory a report
	// was taken out of fails, naming the run whose report is missing
	// (before, it verified as "verified all 1 audit reports").
	partial := filepath.Join(dir, "partial")
	if err := os.MkdirAll(partial, 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(want[0].Path); err != nil || os.WriteFile(filepath.Join(partial, "audit-us-west-2.zip"), b, 0o644) != nil {
		t.Fatal(err)
	}
	vout.Reset()
	short := verifyDir
	short.Path = partial
	err = RunAuditVerify(ctx, short, &vout)
	if wantErr := "run group " + group + ": 1 of its 2 audited runs have no report here: " + ls[1].Run.Id + " (ap-south-1)"; gpupass.ExitCode(err) != gpupass.ExitFindings ||
		!strings.Contains(err.Error(), wantErr) || !strings.Contains(vout.String(), "FAIL "+wantErr) {
		t.Fatalf("verify of a directory missing a report of the group: exit %d, %v; want exit 1 and %q\n%s", gpupass.ExitCode(err), err, wantErr, vout.String())
	}
	// A report of one run (audit ALLOC, no group) put beside the group's
	// fails the set too, named.
	single := opts
	single.AllocationID, single.Out, single.Output = ls[1].Run.Id, filepath.Join(partial, "audit-ap-south-1.zip"), output.Text
	if err := RunAudit(ctx, single, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	vout.Reset()
	err = RunAuditVerify(ctx, short, &vout)
	if wantErr := single.Out + ": not a report of run group " + group; gpupass.ExitCode(err) != gpupass.ExitFindings || !strings.Contains(err.Error(), wantErr) {
		t.Fatalf("verify of a group's report beside a single run's: exit %d, %v; want exit 1 and %q\n%s", gpupass.ExitCode(err), err, wantErr, vout.String())
	}

	// The CI steps: the audit step's audit-path output is the directory,
	// and the audit-verify step given it verifies every zip in it.
	ciEnv := map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": filepath.Join(dir, "github-output"), audit.PasswordEnv: "gpupass-test"}
	ciGetenv := func(k string) string { return ciEnv[k] }
	ciOpts := opts
	ciOpts.Output, ciOpts.Out, ciOpts.Getenv, ciOpts.ErrOut = output.GitHub, filepath.Join(dir, "ci"), ciGetenv, &bytes.Buffer{}
	if err := RunAudit(ctx, ciOpts, &bytes.Buffer{}); err != nil {
		t.Fatalf("audit step of a group: %v", err)
	}
	if b, _ := os.ReadFile(ciEnv["GITHUB_OUTPUT"]); !strings.Contains(string(b), ciOpts.Out) {
		t.Errorf("audit step of a group: audit-path output %q, want the directory %s", b, ciOpts.Out)
	}
	vout.Reset()
	ciVerify := verifyDir
	ciVerify.Path, ciVerify.Output, ciVerify.Getenv, ciVerify.ErrOut = ciOpts.Out, output.GitHub, ciGetenv, &bytes.Buffer{}
	if err := RunAuditVerify(ctx, ciVerify, &vout); err != nil || strings.Count(vout.String(), "\nverified ") != 3 {
		t.Fatalf("audit-verify step of the directory: %v\n%s", err, vout.String())
	}

	// A zip tampered with fails the directory, named, the other verified.
	bad := want[1].Path
	if err := os.WriteFile(bad, testutil.RewriteZip(t, bad, audit.FileRunSummary, func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"succeeded"`), []byte(`"failed"`), 1)
	}), 0o644); err != nil {
		t.Fatal(err)
	}
	vout.Reset()
	err = RunAuditVerify(ctx, verifyDir, &vout)
	if gpupass.ExitCode(err) != gpupass.ExitFindings || !strings.Contains(err.Error(), "1 of 2 audit reports failed: "+bad+" (layer manifest)") ||
		!strings.Contains(vout.String(), "verified "+want[0].Path) || !strings.Contains(vout.String(), "verification of "+bad+" failed at layer manifest") {
		t.Fatalf("verify of a directory with a tampered zip: exit %d, %v\n%s", gpupass.ExitCode(err), err, vout.String())
	}
	// Several zips named on the command line; JSON: a list, one entry
	// per zip.
	var jout, jerr bytes.Buffer
	code := gpupass.Main(ctx, []string{"audit", "verify", want[0].Path, bad, "--key", filepath.Join(dir, "cosign.pub"), "-o", "json"}, nil, &jout, &jerr, gpupass.WithCommands(Command))
	var list []struct {
		File string `json:"file"`
		OK   bool   `json:"ok"`
	}
	if err := json.Unmarshal(jout.Bytes(), &list); code != gpupass.ExitFindings || err != nil || len(list) != 2 || !list[0].OK || list[1].OK || list[1].File != bad {
		t.Fatalf("audit verify ZIP ZIP -o json: exit %d, %+v, %v\n%s\n%s", code, list, err, jout.String(), jerr.String())
	}

	// A token of another region reads none of the group's runs: the
	// answer is the unknown group's, word for word.
	other := opts
	other.Broker.Token = b.Token(t, store.RoleRead, "eu-central-1")
	other.Out = filepath.Join(dir, "other")
	errTheirs := RunAudit(ctx, other, &bytes.Buffer{})
	other.AllocationID = "group-00000000000000ff"
	errUnknown := RunAudit(ctx, other, &bytes.Buffer{})
	if errTheirs == nil || errUnknown == nil || strings.ReplaceAll(errTheirs.Error(), group, "G") != strings.ReplaceAll(errUnknown.Error(), other.AllocationID, "G") ||
		gpupass.ExitCode(errTheirs) != gpupass.ExitCode(errUnknown) {
		t.Errorf("another token's group: %v\nan unknown group: %v\nwant the same answer", errTheirs, errUnknown)
	}
	if _, err := os.Stat(other.Out); err == nil {
		t.Error("audit of an unreadable group wrote its directory")
	}

	// --out naming a zip is refused with the fix.
	zo := opts
	zo.Out = filepath.Join(dir, "group.zip")
	if err := RunAudit(ctx, zo, &bytes.Buffer{}); gpupass.ExitCode(err) != gpupass.ExitUsage || !strings.Contains(err.Error(), "--out "+zo.Out+" names one zip") {
		t.Errorf("audit GROUP --out x.zip: exit %d, %v", gpupass.ExitCode(err), err)
	}
}

// A run of the group that ended before it started (cancelled while
// pending) ran nothing: it gets no zip, as audit ALLOC refuses it, and
// the output says so; the runs that ran are audited.
func TestAuditGroupSkipsRunsThatNeverStarted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, getenv := auditFixture(t)
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	l := brokertest.StartGroup(t, b, "us-west-2")[0]
	sub, err := l.Submitter.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: l.SpecYAML, Region: "us-west-2", Command: []string{"true"}, Group: l.Run.Group}))
	if err != nil {
		t.Fatal(err)
	}
	never := sub.Msg.Run.Id
	if _, err := l.Submitter.Run.Cancel(ctx, connect.NewRequest(&gpupassv1.CancelRequest{AllocId: never, Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	l.Update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, 0)
	out := filepath.Join(dir, "reports")
	opts := AuditOptions{AllocationID: l.Run.Group, Out: out, Key: filepath.Join(dir, "cosign.key"), Getenv: getenv, Output: output.Text,
		Broker: gpupass.BrokerFlags{URL: b.URL, Token: b.Token(t, store.RoleRead, "us-west-2")}}
	var buf bytes.Buffer
	if err := RunAudit(ctx, opts, &buf); err != nil {
		t.Fatalf("audit of a group with a run that never started: %v\n%s", err, buf.String())
	}
	for _, want := range []string{"no zip for run " + never + " in us-west-2: it ended before it started (cancelled)", "wrote " + filepath.Join(out, "audit-us-west-2.zip") + ": run " + l.Run.Id} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("audit output lacks %q:\n%s", want, buf.String())
		}
	}
	if zips, _ := filepath.Glob(filepath.Join(out, "*.zip")); len(zips) != 1 {
		t.Errorf("zips written: %v, want the one run that ran", zips)
	}
}
