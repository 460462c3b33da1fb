package broker_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// tarGz packs entries (name -> size of zero bytes; a trailing / is a
// directory) the way an attacker would hand-craft one.
func tarGz(t testing.TB, n int, entry func(i int) (string, int64)) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(zw)
	zeros := make([]byte, 64<<10)
	for i := range n {
		name, size := entry(i)
		h := &tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg}
		if strings.HasSuffix(name, "/") {
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		for left := h.Size; left > 0; {
			k, _ := tw.Write(zeros[:min(left, int64(len(zeros)))])
			left -= int64(k)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	return buf.Bytes()
}

// TestSubmitRefusesWorkdirBombs: a work dir archive that would unpack to
// too many inodes, too deep a tree, too long a name or too many bytes is
// refused at Submit with an error naming the limit, and no run is stored
// (issue #16, finding 7: a 1.86 MB tar.gz of 300,000 empty files was
// accepted and placed).
func TestSubmitRefusesWorkdirBombs(t *testing.T) {
	t.Parallel()
	bomb := tarGz(t, 300_000, func(i int) (string, int64) { return fmt.Sprintf("f%06d", i), 0 })
	t.Logf("inode bomb: 300,000 empty files in %d bytes of tar.gz", len(bomb))
	for _, tc := range []struct {
		name    string
		archive []byte
		want    string
	}{
		{"300,000 empty files", bomb, "more than 50000 entries"},
		{"a path 40 directories deep", tarGz(t, 1, func(int) (string, int64) { return strings.Repeat("d/", 40) + "x", 1 }), "more than 32 directories deep"},
		{"a 2000-byte name", tarGz(t, 1, func(int) (string, int64) { return strings.Repeat("n", 2000), 1 }), "longer than 1024 bytes"},
		{"2 MiB of content over a 1 MiB limit", tarGz(t, 2, func(i int) (string, int64) { return fmt.Sprintf("big%d", i), 1 << 20 }), "more than 1048576 bytes unpacked"},
		{"an entry leaving the work dir", tarGz(t, 1, func(int) (string, int64) { return "../evil", 1 }), "leaves the work dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg := brokertest.Fast()
			cfg.Workdir.MaxBytes = 1 << 20 // configurable: the content case uses it
			b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
			req := &gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "us-west-2",
				Command: []string{"python3", "train.py"}, WorkdirArchive: tc.archive}
			_, err := c.Run.Submit(ctx, connect.NewRequest(req))
			if brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "workdir_archive") ||
				!strings.Contains(err.Error(), "gpupass-broker serve --workdir-max-*") {
				t.Fatalf("Submit: %v; want invalid_argument saying %q, naming workdir_archive and the broker's --workdir-max-*", err, tc.want)
			}
			resp, err := c.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			if n := len(resp.Msg.Runs); n != 0 {
				t.Errorf("%d runs stored after a refused Submit", n)
			}
		})
	}
	// Within the limits it is accepted.
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	submit(t, c, "us-west-2", func(r *gpupassv1.SubmitRequest) {
		r.WorkdirArchive = tarGz(t, 3, func(i int) (string, int64) { return [...]string{"src/", "src/train.py", "data.csv"}[i], 10 })
	})
}
