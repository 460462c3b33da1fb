package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sync/errgroup"

	"github.com/gpupass/gpupass/internal/bytesize"
	"github.com/gpupass/gpupass/internal/wheel"
)

// PullOptions configure Pull and Inspect.
type PullOptions struct {
	Registry RegistryOptions
	Progress Progress
	Logger   *slog.Logger
	// RequireDigest refuses references by tag: a node pulling for a run
	// must get exactly the bundle the spec pinned.
	RequireDigest bool
	// Sync fsyncs every pulled file before the wheelhouse is renamed into
	// place, so that it survives a power loss, at the price of waiting for
	// the disk (about 3x slower on the shared benchmark disk).
	Sync bool
	// VerifyRecord re-checks every wheel's zip and RECORD hashes, as push
	// did, even when the bundle has a gpupass lock layer. Without one (an
	// artifact pushed by another tool) they are always checked.
	VerifyRecord bool
}

// PullResult is what Pull wrote.
type PullResult struct {
	Reference string  `json:"reference"` // REPO@sha256:...
	Digest    string  `json:"digest"`
	Dir       string  `json:"dir"`
	Wheels    []Wheel `json:"wheels"`
	// Lock is nil for artifacts without a gpupass lock layer (oras push).
	Lock *Lock `json:"lock,omitempty"`
	// RecordChecked says each wheel's zip and RECORD were checked in
	// this pull (no lock layer, or PullOptions.VerifyRecord).
	RecordChecked bool `json:"recordChecked"`
}

// Checked names what the pull checked, for logs and events.
func (r PullResult) Checked() string {
	switch {
	case r.Lock == nil:
		return "blob digests, RECORD hashes"
	case r.RecordChecked:
		return "blob digests, RECORD hashes, lock"
	}
	return "blob digests, lock"
}

// maxManifest bounds what is read of a manifest or lock; real ones are a
// few kilobytes.
const maxManifest = 4 << 20

// Info describes a bundle in a registry (Inspect).
type Info struct {
	Reference    string            `json:"reference"`
	Digest       string            `json:"digest"`
	ArtifactType string            `json:"artifactType"`
	Annotations  map[string]string `json:"annotations"`
	Layers       []LayerInfo       `json:"layers"`
	Lock         *Lock             `json:"lock,omitempty"`
	// Referrers are the artifacts attached to the bundle (signatures,
	// SBOMs, attestations: manifests whose subject is the bundle), found
	// with the registry's referrers API or, on a registry without it, the
	// sha256-<hex> tag that OCI 1.1 clients keep instead.
	Referrers []Referrer `json:"referrers"`
	// ReferrersError says why referrers could not be listed; the rest of
	// Info is still right.
	ReferrersError string `json:"referrersError,omitempty"`
}

// Referrer is one artifact attached to a bundle.
type Referrer struct {
	Digest       string            `json:"digest"`
	ArtifactType string            `json:"artifactType,omitempty"`
	MediaType    string            `json:"mediaType"`
	Size         int64             `json:"size"`
	Annotations  map[string]string `json:"annotations,omitempty"`
}

// LayerInfo is one layer of a bundle.
type LayerInfo struct {
	Title     string `json:"title"`
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

type fetched struct {
	ref      name.Reference
	digest   name.Digest
	manifest *v1.Manifest
	wheels   []v1.Descriptor
	lockDesc *v1.Descriptor
	puller   *remote.Puller
	opts     []remote.Option // the puller's: one handshake for the repository
	blobs    *http.Client    // wheel blobs, read past ggcr (see pullTransport)
}

// fetchManifest gets and checks the manifest: an OCI image manifest whose
// layers all carry safe titles, wheels or the lock, each title once.
func fetchManifest(ctx context.Context, ref string, o RegistryOptions) (*fetched, error) {
	r, err := o.parseRef(ref)
	if err != nil {
		return nil, err
	}
	tr, err := o.pullTransport(ctx, r.Context())
	if err != nil {
		return nil, fmt.Errorf("reaching %s: %w", ref, explain(err))
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(tr), remote.WithJobs(o.jobs())}
	p, err := remote.NewPuller(opts...)
	if err != nil {
		return nil, err
	}
	blobs := &http.Client{Transport: tr, CheckRedirect: checkRedirect}
	raw, dgst, contentType, err := getManifest(ctx, blobs, r)
	if err != nil {
		return nil, fmt.Errorf("fetching manifest of %s: %w", ref, explain(err))
	}
	m, err := checkManifest(raw, contentType)
	if err != nil {
		return nil, fmt.Errorf("%w: manifest of %s (%s): %w", ErrVerification, ref, dgst, err)
	}
	f := &fetched{ref: r, digest: r.Context().Digest(dgst.String()), manifest: m, puller: p, opts: opts, blobs: blobs}
	seen := map[string]bool{}
	for i, l := range m.Layers {
		title := l.Annotations[AnnotationTitle]
		if title == "" {
			return nil, fmt.Errorf("%s: layer %d (%s) has no %s annotation; a bundle names every file", ref, i, l.Digest, AnnotationTitle)
		}
		if seen[title] {
			return nil, fmt.Errorf("%w: %s: title %q appears twice", ErrVerification, ref, title)
		}
		seen[title] = true
		if title == LockFile && string(l.MediaType) == LockMediaType {
			if l.Size > maxManifest {
				return nil, fmt.Errorf("%s: lock layer of %d bytes is too large", ref, l.Size)
			}
			f.lockDesc = &m.Layers[i]
			continue
		}
		// The title becomes a file name on disk: only a plain wheel
		// file name passes (no separators, no "..", no odd characters).
		if _, err := wheel.ParseFilename(title); err != nil {
			return nil, fmt.Errorf("%w: %s: layer %d (%s) title refused: %w", ErrVerification, ref, i, l.Digest, err)
		}
		if l.Size < 0 {
			return nil, fmt.Errorf("%s: layer %s has a negative size", ref, title)
		}
		if l.Digest.Algorithm != "sha256" {
			return nil, fmt.Errorf("%w: %s: layer %s has a %s digest; a bundle's wheels are addressed by sha256", ErrVerification, ref, title, l.Digest.Algorithm)
		}
		f.wheels = append(f.wheels, l)
	}
	if len(f.wheels) == 0 {
		return nil, fmt.Errorf("%s holds no wheels", ref)
	}
	return f, nil
}

func (f *fetched) readLock(ctx context.Context) (*Lock, error) {
	if f.lockDesc == nil {
		return nil, nil
	}
	l, err := f.puller.Layer(ctx, f.ref.Context().Digest(f.lockDesc.Digest.String()))
	if err != nil {
		return nil, fmt.Errorf("fetching lock blob %s: %w", f.lockDesc.Digest, explain(err))
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("fetching lock blob %s: %w", f.lockDesc.Digest, explain(err))
	}
	defer rc.Close()
	// ggcr checks the digest at EOF, so read to the end.
	b, err := io.ReadAll(io.LimitReader(rc, maxManifest+1))
	if err != nil {
		return nil, fmt.Errorf("fetching lock blob %s: %w", f.lockDesc.Digest, explain(err))
	}
	if int64(len(b)) != f.lockDesc.Size {
		return nil, fmt.Errorf("lock blob %s: %d bytes, manifest says %d", f.lockDesc.Digest, len(b), f.lockDesc.Size)
	}
	lock, err := parseLock(b)
	if err != nil {
		return nil, err
	}
	return &lock, nil
}

// Inspect reads a bundle's manifest and lock without pulling wheels.
func Inspect(ctx context.Context, ref string, o PullOptions) (Info, error) {
	f, err := fetchManifest(ctx, ref, o.Registry)
	if err != nil {
		return Info{}, err
	}
	lock, err := f.readLock(ctx)
	if err != nil {
		return Info{}, err
	}
	info := Info{
		Reference: f.digest.String(), Digest: f.digest.DigestStr(),
		ArtifactType: f.manifest.ArtifactType, Annotations: f.manifest.Annotations, Lock: lock,
		Layers: []LayerInfo{},
	}
	if info.Annotations == nil {
		info.Annotations = map[string]string{}
	}
	for _, l := range f.manifest.Layers {
		info.Layers = append(info.Layers, LayerInfo{Title: l.Annotations[AnnotationTitle], MediaType: string(l.MediaType), Digest: l.Digest.String(), Size: l.Size})
	}
	info.Referrers, err = referrers(f.digest, f.opts)
	if err != nil {
		info.ReferrersError = fmt.Sprintf("listing referrers of %s: %v (the bundle is listed in full; attached signatures or SBOMs could not be read: check the registry's access rights for the repository's referrers or its sha256-<hex> tag)", f.digest, explain(err))
	}
	return info, nil
}

// maxArtifactTypeLookups bounds the manifests referrers fetches to learn
// an artifact type the registry did not report; the rest are listed as
// the registry gave them.
const maxArtifactTypeLookups = 32

// artifactType reads the artifactType of the manifest at d.
func artifactType(d name.Digest, opts []remote.Option) (string, error) {
	desc, err := remote.Get(d, opts...)
	if err != nil {
		return "", err
	}
	var m struct {
		ArtifactType string `json:"artifactType"`
	}
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		return "", err
	}
	return m.ArtifactType, nil
}

// referrers lists what is attached to the manifest d, sorted by artifact
// type and digest. ggcr asks the referrers API first and, when the
// registry does not have it (404, 400 or 406, or a reply that is not an
// index), reads the fallback tag; no tag means nothing is attached.
func referrers(d name.Digest, opts []remote.Option) ([]Referrer, error) {
	idx, err := remote.Referrers(d, opts...)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	out := []Referrer{}
	lookups := 0
	for _, m := range im.Manifests {
		r := Referrer{
			Digest: m.Digest.String(), ArtifactType: m.ArtifactType, MediaType: string(m.MediaType),
			Size: m.Size, Annotations: m.Annotations,
		}
		if (r.ArtifactType == "" || r.ArtifactType == EmptyMediaType) && lookups < maxArtifactTypeLookups {
			// Some registries (go-containerregistry's own) report the
			// config's media type where the manifest has an artifactType;
			// the manifest says what the artifact is.
			lookups++
			if t, err := artifactType(d.Context().Digest(r.Digest), opts); err == nil && t != "" {
				r.ArtifactType = t
			}
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ArtifactType != out[j].ArtifactType {
			return out[i].ArtifactType < out[j].ArtifactType
		}
		return out[i].Digest < out[j].Digest
	})
	return out, nil
}

// Pull fetches the bundle at ref (tag or digest) into dir, which must not
// exist or be empty. Every blob is checked against its digest and size,
// and the wheels against the lock layer. Each wheel's zip and RECORD are
// checked again only for an artifact without a lock layer (gpupass did
// not push it) or with VerifyRecord: the blob digests, pinned through
// the manifest digest and listed in the lock, already prove the bytes
// are the ones push checked. Files are staged in a sibling directory that
// is renamed into place only when everything checked out, so a failed
// pull leaves nothing. The node agent calls this before a run starts
// (then Install, which checks each file against RECORD as it writes it).
func Pull(ctx context.Context, ref, dir string, o PullOptions) (PullResult, error) {
	log := orDiscard(o.Logger)
	prog := orNop(o.Progress)
	dir = filepath.Clean(dir)
	if err := checkTarget(dir); err != nil {
		return PullResult{}, err
	}
	if o.RequireDigest {
		r, err := o.Registry.parseRef(ref)
		if err != nil {
			return PullResult{}, err
		}
		if _, ok := r.(name.Digest); !ok {
			return PullResult{}, fmt.Errorf("bundle %s: a run pulls by digest (REPO@sha256:...), not by tag", ref)
		}
	}
	f, err := fetchManifest(ctx, ref, o.Registry)
	if err != nil {
		return PullResult{}, err
	}
	lock, err := f.readLock(ctx)
	if err != nil {
		return PullResult{}, err
	}
	if lock != nil {
		if err := lockMatches(*lock, f.wheels); err != nil {
			return PullResult{}, fmt.Errorf("%w: %s: %w", ErrVerification, ref, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return PullResult{}, fmt.Errorf("creating %s: %w", filepath.Dir(dir), err)
	}
	if err := checkSpace(filepath.Dir(dir), f.wheels); err != nil {
		return PullResult{}, fmt.Errorf("pulling %s: %w", ref, err)
	}
	stage, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".partial-")
	if err != nil {
		return PullResult{}, fmt.Errorf("staging the pull: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(stage)
		}
	}()

	checkRecord := lock == nil || o.VerifyRecord
	wheels := make([]Wheel, len(f.wheels))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Registry.jobs())
	for i, d := range f.wheels {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			title := d.Annotations[AnnotationTitle]
			prog.Start(title, d.Size)
			w, err := pullWheel(gctx, f, d, stage, prog, o.Sync, checkRecord)
			prog.Done(title, false, err)
			if err != nil {
				return err
			}
			log.Debug("wheel pulled", "wheel", title, "digest", d.Digest.String())
			wheels[i] = w
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return PullResult{}, fmt.Errorf("pulling %s: %w (nothing was written to %s)", ref, err, dir)
	}
	if lock != nil {
		b, err := lock.marshal()
		if err != nil {
			return PullResult{}, err
		}
		if err := os.WriteFile(filepath.Join(stage, LockFile), b, 0o644); err != nil {
			return PullResult{}, fmt.Errorf("writing %s: %w", LockFile, err)
		}
	}
	if err := os.Chmod(stage, 0o755); err != nil {
		return PullResult{}, err
	}
	// An empty target is replaced; rename will not replace a directory
	// that holds anything, which checkTarget ruled out.
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return PullResult{}, fmt.Errorf("replacing %s: %w", dir, err)
	}
	if err := os.Rename(stage, dir); err != nil {
		return PullResult{}, fmt.Errorf("moving the pulled wheelhouse into %s: %w", dir, err)
	}
	done = true
	if o.Sync {
		syncDir(filepath.Dir(dir))
	}
	for i := range wheels {
		wheels[i].path = filepath.Join(dir, wheels[i].File)
	}
	return PullResult{Reference: f.digest.String(), Digest: f.digest.DigestStr(), Dir: dir, Wheels: wheels, Lock: lock, RecordChecked: checkRecord}, nil
}

// checkSpace refuses a pull whose wheels do not fit in the free space of
// the filesystem holding dir, before a byte is written: a pull that
// fills the disk halfway fails anyway, after slowing everything else on
// the node.
func checkSpace(dir string, wheels []v1.Descriptor) error {
	free, ok := freeSpace(dir)
	if !ok {
		return nil
	}
	var need int64
	for _, d := range wheels {
		need += d.Size
		if need < 0 { // sizes near MaxInt64 from a hostile manifest
			need = math.MaxInt64
			break
		}
	}
	if need > free {
		return fmt.Errorf("the bundle's wheels take %s, but %s has %s free: free space or pull elsewhere", bytesize.Format(need), dir, bytesize.Format(free))
	}
	return nil
}

func checkTarget(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("pull target %s: %w", dir, err)
	case len(entries) > 0:
		return fmt.Errorf("pull target %s is not empty: give a new or empty directory so that a pull never mixes with other files", dir)
	}
	return nil
}

func lockMatches(lock Lock, layers []v1.Descriptor) error {
	byFile := map[string]Wheel{}
	for _, w := range lock.Wheels {
		byFile[w.File] = w
	}
	if len(byFile) != len(layers) {
		return fmt.Errorf("lock lists %d wheels, the manifest %d", len(byFile), len(layers))
	}
	for _, l := range layers {
		title := l.Annotations[AnnotationTitle]
		w, ok := byFile[title]
		switch {
		case !ok:
			return fmt.Errorf("wheel %s is not in the lock", title)
		case "sha256:"+w.SHA256 != l.Digest.String() || w.Size != l.Size:
			return fmt.Errorf("wheel %s: lock says sha256:%s (%d bytes), manifest says %s (%d bytes)", title, w.SHA256, w.Size, l.Digest, l.Size)
		}
	}
	return nil
}

// pullWheel downloads one wheel into stage, checking its size and digest,
// and, when checkRecord is set, its zip and RECORD from the file.
func pullWheel(ctx context.Context, f *fetched, d v1.Descriptor, stage string, prog Progress, fsync, checkRecord bool) (Wheel, error) {
	title := d.Annotations[AnnotationTitle]
	fail := func(err error) (Wheel, error) {
		return Wheel{}, fmt.Errorf("wheel %s (blob %s): %w", title, d.Digest, explain(err))
	}
	fn, err := wheel.ParseFilename(title)
	if err != nil {
		return fail(err)
	}
	rc, err := openBlob(ctx, f.blobs, f.ref.Context(), d)
	if err != nil {
		return fail(err)
	}
	defer rc.Close()
	p := filepath.Join(stage, title)
	out, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fail(err)
	}
	defer out.Close()
	// No fallocate of the declared size: it made no measurable difference
	// (1 GB stored pull, 5 paired rounds: 1.740 s with it, 1.732 s
	// without), checkSpace already fails early on a full disk, and the
	// size is the registry's word.
	// Read one byte past the declared size so a registry that sends more
	// than the manifest says is caught, not truncated into a match.
	h := sha256.New()
	n, err := receive(out, h, progressReader{io.LimitReader(rc, d.Size+1), title, prog})
	if err != nil {
		return fail(err)
	}
	if n != d.Size {
		return fail(fmt.Errorf("%w: got %d bytes, manifest says %d", ErrVerification, n, d.Size))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != d.Digest.Hex {
		return fail(fmt.Errorf("%w: the blob's bytes hash to sha256:%s, not to the manifest's digest", ErrVerification, got))
	}
	if fsync {
		if err := out.Sync(); err != nil {
			return fail(err)
		}
	}
	if checkRecord {
		if _, err := out.Seek(0, io.SeekStart); err != nil {
			return fail(err)
		}
		if _, err := checkWheel(ctx, out, fn, nil); err != nil {
			var re *wheel.ReadError
			switch {
			case ctx.Err() != nil:
				// Stopped, not refuted: whatever the check said after that.
				return fail(ctx.Err())
			case errors.As(err, &re):
				return fail(err) // the disk, not the wheel
			}
			return fail(fmt.Errorf("%w: %w", ErrVerification, err))
		}
	}
	return Wheel{
		File: title, Name: fn.Name(), Version: fn.Version, Tags: tagStrings(fn.Tags),
		SHA256: d.Digest.Hex, Size: d.Size,
	}, nil
}

// receiveBuffer is how much of a blob is gathered before it is hashed and
// written: the network gives a few tens of KiB per read, and a hash call
// and a write per read cost more than gathering; a buffer that stays in
// the CPU's cache between the hash and the write costs less than a
// bigger one.
const receiveBuffer = 256 << 10

// receive copies src to out, hashing it into h on the way, and returns
// how many bytes it copied.
func receive(out io.Writer, h hash.Hash, src io.Reader) (int64, error) {
	b := make([]byte, receiveBuffer)
	var n int64
	for {
		// Not io.ReadFull: it turns a short final piece into
		// io.ErrUnexpectedEOF, which is also what a dropped connection
		// gives.
		k := 0
		var err error
		for k < len(b) && err == nil {
			var r int
			r, err = src.Read(b[k:])
			k += r
		}
		if k > 0 {
			h.Write(b[:k])
			if werr := writePieces(out, b[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		switch {
		case err == io.EOF:
			return n, nil
		case err != nil:
			return n, fmt.Errorf("download: %w", redactURL(err))
		}
	}
}

// ctxReaderAt fails reads once ctx is done, so that checking a wheel
// from its file (inflating a big one takes seconds) stops soon after the
// pull or push is cancelled, or another wheel failed.
type ctxReaderAt struct {
	ctx context.Context
	r   io.ReaderAt
}

func (c ctxReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.ReadAt(p, off)
}

type progressReader struct {
	r     io.Reader
	title string
	prog  Progress
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.prog.Add(p.title, int64(n))
	}
	return n, err
}

// writePiece is the most one write() call hands the kernel. The kernel
// sizes the page-cache folios it allocates for a write by the write's
// length (ext4 uses large folios on this 6.18 kernel). On a VM with free page
// reporting (this project's build machine: firecracker,
// page_reporting_order=11), large folios come from memory the host has
// taken back, and every first touch of it is a host fault inside the
// kernel's copy. Writing 1 GB there, with memory left idle for 5 s before
// each run: 1 MiB writes took 1.6-2.7 s of system time, 64-256 KiB writes
// 1.1-2.9 s, 32 KiB writes 0.25-0.30 s (8 of 8 runs). 32 KiB is also what
// io.Copy (and so oras) uses; the extra syscalls cost about 30 ms per GB.
const writePiece = 32 << 10

// writePieces writes b to w in calls of at most writePiece bytes.
func writePieces(w io.Writer, b []byte) error {
	for len(b) > 0 {
		n := min(len(b), writePiece)
		if _, err := w.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// CheckLock compares a wheelhouse's lock file (written by Pull), when it
// has one, with the wheels Scan found: the same files with the same
// digests, nothing missing, nothing added. It returns false when dir has
// no lock.
func CheckLock(dir string, wheels []Wheel) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, LockFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	lock, err := parseLock(b)
	if err != nil {
		return true, fmt.Errorf("%w: %s: %w", ErrVerification, dir, err)
	}
	have := map[string]Wheel{}
	for _, w := range wheels {
		have[w.File] = w
	}
	var problems []string
	for _, lw := range lock.Wheels {
		w, ok := have[lw.File]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s: in the lock but not in the wheelhouse", lw.File))
		case w.SHA256 != lw.SHA256 || w.Size != lw.Size:
			problems = append(problems, fmt.Sprintf("%s: sha256:%s (%d bytes), the lock says sha256:%s (%d bytes)", lw.File, w.SHA256, w.Size, lw.SHA256, lw.Size))
		}
		delete(have, lw.File)
	}
	for f := range have {
		problems = append(problems, fmt.Sprintf("%s: not in the lock", f))
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return true, fmt.Errorf("%w: %s does not match its %s:\n  - %s", ErrVerification, dir, LockFile, strings.Join(problems, "\n  - "))
	}
	return true, nil
}
