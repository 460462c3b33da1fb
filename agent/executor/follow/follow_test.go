package follow

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/events"
)

// state is a runner's attempt state: its own field beside the offsets.
type state struct {
	Job string `json:"job"`
	Offsets
}

type step struct {
	stdout, stderr string // appended before the read
	final          bool
	want           []executor.Line
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	if s == "" {
		return
	}
	fh, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
}

func out(s string, end int64) executor.Line {
	return executor.Line{Stream: events.Stdout, Text: s, Offset: end}
}
func errl(s string, end int64) executor.Line {
	return executor.Line{Stream: events.Stderr, Text: s, Offset: end}
}

// TestRead: each read hands over the complete lines written since the
// last one, each with the offset where it ends in its file, stdout and
// stderr apart; a partial line waits for its newline, or the final read.
func TestRead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		maxLine int
		steps   []step
	}{
		{"lines and their end offsets", 0, []step{
			{stdout: "a\nbb\n", want: []executor.Line{out("a", 2), out("bb", 5)}},
			{stdout: "ccc\n", want: []executor.Line{out("ccc", 9)}},
		}},
		{"stdout and stderr apart", 0, []step{
			{stdout: "o\n", stderr: "e1\ne2\n", want: []executor.Line{out("o", 2), errl("e1", 3), errl("e2", 6)}},
		}},
		{"a partial line waits for its newline", 0, []step{
			{stdout: "one\npar", want: []executor.Line{out("one", 4)}},
			{stdout: "ti", want: nil},
			{stdout: "al\nx", want: []executor.Line{out("partial", 12)}},
		}},
		{"the final read hands over the last line", 0, []step{
			{stdout: "x\ny", stderr: "no newline", want: []executor.Line{out("x", 2)}},
			{final: true, want: []executor.Line{out("y", 3), errl("no newline", 10)}},
		}},
		{"CRLF", 0, []step{
			{stdout: "dos\r\n", want: []executor.Line{out("dos", 5)}},
		}},
		{"a line longer than maxLine is cut", 4, []step{
			{stdout: "abcdefg\nok\n", want: []executor.Line{{Stream: events.Stdout, Text: "abcd", Cut: 3, Offset: 8}, out("ok", 11)}},
		}},
		{"bytes that are not UTF-8", 0, []step{
			{stdout: "a\xffb\n", want: []executor.Line{{Stream: events.Stdout, Text: "a\uFFFDb", InvalidUTF8: true, Offset: 4}}},
		}},
		{"files not there yet (the job is pending)", 0, []step{
			{want: nil},
			{final: true, want: nil},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base := filepath.Join(t.TempDir(), "attempt-1")
			var got []executor.Line
			st := &state{}
			f, err := Open(base, st, tc.maxLine, func(l executor.Line) { got = append(got, l) })
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				appendFile(t, base+".out", s.stdout)
				appendFile(t, base+".err", s.stderr)
				got = nil
				if err := f.Read(s.final); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(s.want, got); diff != "" {
					t.Fatalf("read %d (-want +got):\n%s", i+1, diff)
				}
			}
		})
	}
}

// TestRestartReadsOn: an agent restarted under the attempt reads on from
// the offsets the last one saved in the state file (its partial line
// included, read again from its start), and keeps the runner's own
// fields; the file's keys are what runners wrote before this package.
func TestRestartReadsOn(t *testing.T) {
	t.Parallel()
	base := filepath.Join(t.TempDir(), "attempt-1")
	var got []executor.Line
	collect := func(l executor.Line) { got = append(got, l) }
	f, err := Open(base, &state{Job: "job-1"}, 0, collect)
	if err != nil {
		t.Fatal(err)
	}
	appendFile(t, base+".out", "one\ntw")
	appendFile(t, base+".err", "warn\n")
	if err := f.Read(false); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(base + ".json")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"job":"job-1","stdout_offset":4,"stderr_offset":5}`; string(b) != want {
		t.Fatalf("state file = %s, want %s", b, want)
	}

	// The agent dies here; the job writes on.
	appendFile(t, base+".out", "o\nthree\n")
	got = nil
	st := &state{}
	f, err = Open(base, st, 0, collect)
	if err != nil {
		t.Fatal(err)
	}
	if want := (state{Job: "job-1", Offsets: Offsets{Stdout: 4, Stderr: 5}}); *st != want {
		t.Fatalf("loaded state = %+v, want %+v", *st, want)
	}
	if err := f.Read(false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]executor.Line{out("two", 8), out("three", 14)}, got); diff != "" {
		t.Fatalf("lines after the restart (-want +got):\n%s", diff)
	}
}

// TestOpenBadState: a state file that is not JSON fails Open, naming it.
func TestOpenBadState(t *testing.T) {
	t.Parallel()
	base := filepath.Join(t.TempDir(), "attempt-1")
	if err := os.WriteFile(base+".json", []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Open(base, &state{}, 0, func(executor.Line) {})
	if err == nil || !strings.Contains(err.Error(), base+".json") {
		t.Fatalf("Open = %v, want an error naming %s.json", err, base)
	}
}

// TestReadIsBounded: a job that wrote more than maxRead since the last
// poll is handed over in pieces, no line lost or repeated.
func TestReadIsBounded(t *testing.T) {
	t.Parallel()
	base := filepath.Join(t.TempDir(), "attempt-1")
	line := strings.Repeat("x", 1023) + "\n"
	n := maxRead/len(line) + 100
	appendFile(t, base+".out", strings.Repeat(line, n))
	count, last := 0, int64(0)
	f, err := Open(base, &state{}, 0, func(l executor.Line) { count++; last = l.Offset })
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Read(false); err != nil {
		t.Fatal(err)
	}
	if count != maxRead/len(line) {
		t.Fatalf("first read handed over %d lines, want %d (one read is at most %d bytes)", count, maxRead/len(line), maxRead)
	}
	if err := f.Read(false); err != nil {
		t.Fatal(err)
	}
	if count != n || last != int64(n*len(line)) {
		t.Fatalf("after two reads: %d lines ending at %d, want %d ending at %d", count, last, n, n*len(line))
	}
}

// TestStart: the attempt's ids come from its environment, its files go
// in WORKDIR/SUB, and a.From (where the run's spool holds the lines)
// wins over the state file's offsets.
func TestStart(t *testing.T) {
	t.Parallel()
	env := []string{executor.EnvAllocID + "=alloc-1", executor.EnvAttempt + "=1", executor.EnvAttempt + "=2"}
	for _, tc := range []struct {
		name    string
		env     []string
		from    *executor.Offsets
		want    Offsets
		wantErr string
	}{
		{"from the state file", env, nil, Offsets{Stdout: 10, Stderr: 20}, ""},
		{"from the spool's mark", env, &executor.Offsets{Stdout: 3, Stderr: 4}, Offsets{Stdout: 3, Stderr: 4}, ""},
		{"no allocation id", env[1:], nil, Offsets{}, "has no " + executor.EnvAllocID},
		{"attempt not a number", []string{executor.EnvAllocID + "=a", executor.EnvAttempt + "=x"}, nil, Offsets{}, "is not a number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, ".remote"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, ".remote", "attempt-2.json"), []byte(`{"job":"j","stdout_offset":10,"stderr_offset":20}`), 0o644); err != nil {
				t.Fatal(err)
			}
			st := &state{}
			at, err := Start(executor.Attempt{Dir: dir, Env: tc.env, From: tc.from}, ".remote", st, func(executor.Line) {})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Start = %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if at.AllocID != "alloc-1" || at.N != "2" || at.Base != filepath.Join(dir, ".remote", "attempt-2") {
				t.Errorf("Start = %+v, want alloc-1, attempt 2 (the last one set), base %s/.remote/attempt-2", at, dir)
			}
			if st.Offsets != tc.want || st.Job != "j" {
				t.Errorf("state = %+v, want job j and offsets %+v", *st, tc.want)
			}
		})
	}
}

// TestLineWithoutNewlineIsBounded: a job writing far more than a line's
// limit without a newline costs the follower maxLine bytes, not all it
// wrote (it held every byte since the last newline, read after read), and
// the line, when its newline comes, is cut to maxLine with the rest
// counted, ending where the file says.
func TestLineWithoutNewlineIsBounded(t *testing.T) {
	t.Parallel()
	base := filepath.Join(t.TempDir(), "attempt-1")
	const maxLine = 999
	var got []executor.Line
	f, err := Open(base, &state{}, maxLine, func(l executor.Line) { got = append(got, l) })
	if err != nil {
		t.Fatal(err)
	}
	chunk := strings.Repeat("é", maxRead/4) // maxRead/2 bytes
	total := 0
	for range 5 {
		appendFile(t, base+".out", chunk)
		total += len(chunk)
		if err := f.Read(false); err != nil {
			t.Fatal(err)
		}
		if held := cap(f.partial[0]); held > 4*maxLine {
			t.Fatalf("after %d bytes without a newline the follower holds %d bytes of it, want at most about %d", total, held, maxLine)
		}
	}
	if len(got) != 0 {
		t.Fatalf("%d lines handed over before the newline", len(got))
	}
	appendFile(t, base+".out", "\r\nnext\n")
	if err := f.Read(false); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("handed over %d lines, want 2", len(got))
	}
	l := got[0]
	// 999 bytes end halfway through an é: the cut backs off to 998.
	if want := strings.Repeat("é", 499); l.Text != want || l.InvalidUTF8 {
		t.Errorf("the long line holds %d bytes (invalid UTF-8 %v), want the first %d whole characters", len(l.Text), l.InvalidUTF8, len(want))
	}
	if l.Cut != total+1-len(l.Text) || l.Offset != int64(total+2) {
		t.Errorf("cut %d ending at %d, want cut %d (the \\r too) ending at %d", l.Cut, l.Offset, total+1-len(l.Text), total+2)
	}
	if got[1].Text != "next" || got[1].Offset != int64(total+7) {
		t.Errorf("next line %q ending at %d, want \"next\" ending at %d", got[1].Text, got[1].Offset, total+7)
	}
}
