package bundle_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/bundle"
)

func TestTextProgress(t *testing.T) {
	t.Parallel()
	feed := func(p *bundle.TextProgress) {
		p.Start("a.whl", 2<<20)
		p.Start("b.whl", 1024)
		p.Start("c.whl", 10)
		p.Add("a.whl", 2<<20)
		p.Done("a.whl", false, nil)
		p.Done("b.whl", true, nil)
		p.Done("c.whl", false, errors.New("boom"))
		p.Finish()
	}
	var ci bytes.Buffer
	feed(bundle.NewTextProgress(&ci, false, "pushed"))
	want := "pushed  a.whl (2.0 MiB)\nexists  b.whl (1.0 KiB, not sent)\nfailed  c.whl\n"
	if diff := cmp.Diff(want, ci.String()); diff != "" {
		t.Errorf("CI lines (-want +got):\n%s", diff)
	}
	var tty bytes.Buffer
	feed(bundle.NewTextProgress(&tty, true, "pushed"))
	out := tty.String()
	if !strings.HasPrefix(out, "\r[") || !strings.HasSuffix(out, "\n") || !strings.Contains(out, "3/3 blobs") || strings.Contains(out, "pushed  a.whl") {
		t.Errorf("TTY output = %q, want a redrawn bar ending in a newline", out)
	}
}
