package bundle

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gpupass/gpupass/internal/bytesize"
)

// TextProgress renders Progress for people. On a terminal it redraws one
// status line (a bar); elsewhere (CI logs) it prints one quiet line per
// blob when it finishes, so logs stay short and greppable.
type TextProgress struct {
	w    io.Writer
	tty  bool
	verb string // "pushed" / "pulled"

	mu        sync.Mutex
	total     int64
	done      int64
	blobs     int
	finished  int
	started   time.Time
	lastDraw  time.Time
	sizes     map[string]int64
	drawEvery time.Duration
}

// NewTextProgress returns a TextProgress writing to w; tty selects the bar.
func NewTextProgress(w io.Writer, tty bool, verb string) *TextProgress {
	return &TextProgress{w: w, tty: tty, verb: verb, sizes: map[string]int64{}, started: time.Now(), drawEvery: 100 * time.Millisecond}
}

// Start implements Progress.
func (p *TextProgress) Start(name string, size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total += size
	p.blobs++
	p.sizes[name] = size
}

// WantsBytes says whether Add must be called as bytes move: a bar does;
// quiet lines do not, and a push then lets the kernel send the files.
func (p *TextProgress) WantsBytes() bool { return p.tty }

// Add implements Progress.
func (p *TextProgress) Add(_ string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	if p.tty && time.Since(p.lastDraw) >= p.drawEvery {
		p.draw()
	}
}

// Done implements Progress.
func (p *TextProgress) Done(name string, skipped bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished++
	if skipped {
		// Bytes of a skipped blob count as done, so the bar reaches 100%.
		p.done += p.sizes[name]
	}
	if p.tty {
		p.draw()
		return
	}
	switch {
	case err != nil:
		fmt.Fprintf(p.w, "failed  %s\n", name)
	case skipped:
		fmt.Fprintf(p.w, "exists  %s (%s, not sent)\n", name, bytesize.Format(p.sizes[name]))
	default:
		fmt.Fprintf(p.w, "%s  %s (%s)\n", p.verb, name, bytesize.Format(p.sizes[name]))
	}
}

// Finish ends the bar's line.
func (p *TextProgress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.blobs > 0 {
		p.draw()
		fmt.Fprintln(p.w)
	}
}

func (p *TextProgress) draw() {
	p.lastDraw = time.Now()
	const width = 30
	frac := 1.0
	if p.total > 0 {
		frac = min(float64(p.done)/float64(p.total), 1)
	}
	n := int(frac * width)
	bar := make([]byte, width)
	for i := range bar {
		bar[i] = ' '
		if i < n {
			bar[i] = '='
		}
	}
	rate := float64(p.done) / max(time.Since(p.started).Seconds(), 0.001)
	fmt.Fprintf(p.w, "\r[%s] %3.0f%% %s/%s %d/%d blobs %s/s ", bar, frac*100, bytesize.Format(p.done), bytesize.Format(p.total), p.finished, p.blobs, bytesize.Format(int64(rate)))
}
