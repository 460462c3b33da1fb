package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/probe"
)

// TestReportSentDetail: the run log names each hash once, by its own
// name; it used to print the spec's hash as "runtime fingerprint".
func TestReportSentDetail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, runtime, want string
	}{
		{"equal", "sha256:aa", "signed run report sent to the broker: runtime fingerprint equals the spec fingerprint sha256:aa"},
		{"differ", "sha256:bb", "signed run report sent to the broker: runtime fingerprint sha256:bb differs from the spec fingerprint sha256:aa"},
	} {
		got := reportSentDetail(&conformance.Report{SpecFingerprint: "sha256:aa", RuntimeFingerprint: tc.runtime})
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestPackageChecks(t *testing.T) {
	t.Parallel()
	found := probe.PythonSection{Found: true, Packages: map[string]string{"numpy": "1.24.2", "torch": "2.1.0+cu121", "flash-attn": ""}}
	tests := []struct {
		name   string
		pin    string
		ps     probe.PythonSection
		status conformance.Status
		actual string
	}{
		{"equal", "1.24.2", found, conformance.Pass, "1.24.2"},
		{"equal with trailing zero (PEP 440)", "1.24.2.0", found, conformance.Pass, "1.24.2"},
		{"differs", "1.26.4", found, conformance.Fail, "1.24.2"},
		{"not pinned", "", found, conformance.Warn, "1.24.2"},
		{"python not usable", "1.24.2", probe.PythonSection{Reason: "python3.99: not found"}, conformance.Fail, "not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := packageChecks(map[string]string{"numpy": tc.pin}, tc.ps, 1.5)
			if len(got) != 1 || got[0].Name != "package.numpy" || got[0].Status != tc.status || got[0].Actual != tc.actual || got[0].DurationMS != 1.5 {
				t.Errorf("packageChecks = %+v, want package.numpy %s actual %q", got, tc.status, tc.actual)
			}
		})
	}
	// A version that is not PEP 440 fails with the reason, never by a
	// string compare (spec.PinMatches).
	odd := probe.PythonSection{Found: true, Packages: map[string]string{"numpy": "1.24.2-custom!"}}
	if got := packageChecks(map[string]string{"numpy": "1.24.2-custom!"}, odd, 0); got[0].Status != conformance.Fail || !strings.Contains(got[0].Message, "not a PEP 440 version") {
		t.Errorf("unparsable installed version: %+v, want a failure naming PEP 440", got[0])
	}
	// Several packages: sorted, the local label of a pin must match, a
	// missing package fails.
	got := packageChecks(map[string]string{"torch": "2.1.0+cu118", "numpy": "1.24.2", "flash-attn": "2.5.5"}, found, 0)
	var st []string
	for _, c := range got {
		st = append(st, c.Name+"="+string(c.Status)+":"+c.Actual)
	}
	want := []string{"package.flash-attn=fail:not installed", "package.numpy=pass:1.24.2", "package.torch=fail:2.1.0+cu121"}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("checks (-want +got):\n%s", diff)
	}
}

// fakeSink answers SubmitRunReport with errs in turn.
type fakeSink struct {
	errs  []error
	calls int
}

func (f *fakeSink) SubmitRunReport(context.Context, *Assignment, []byte, string) error {
	f.calls++
	if len(f.errs) == 0 {
		return nil
	}
	err := f.errs[0]
	f.errs = f.errs[1:]
	return err
}

func TestSubmitWithRetry(t *testing.T) {
	t.Parallel()
	// As the broker's sink returns them: classified at the client edge.
	unavailable := fmt.Errorf("sending: %w", brokerErr(connect.NewError(connect.CodeUnavailable, errors.New("broker restarting"))))
	denied := fmt.Errorf("sending: %w", brokerErr(connect.NewError(connect.CodePermissionDenied, errors.New("signature does not verify"))))
	tests := []struct {
		name      string
		errs      []error
		wantErr   error
		wantCalls int
	}{
		{"accepted", nil, nil, 1},
		{"broker away, then back", []error{unavailable, unavailable}, nil, 3},
		{"refused: final", []error{denied}, denied, 1},
		{"lease lost: final", []error{ErrStaleLease}, ErrStaleLease, 1},
		{"old broker", []error{errReportUnsupported}, errReportUnsupported, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &fakeSink{errs: tc.errs}
			err := submitWithRetry(context.Background(), s, &Assignment{AllocID: "alloc-1"}, &SignedReport{}, slog.New(slog.DiscardHandler))
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) || s.calls != tc.wantCalls {
				t.Errorf("err %v after %d calls; want %v after %d", err, s.calls, tc.wantErr, tc.wantCalls)
			}
		})
	}
}
