package bundle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// PushOptions configure Push.
type PushOptions struct {
	Registry RegistryOptions
	// Lock metadata: the spec's fingerprint and python, when a spec was given.
	Fingerprint string
	Python      string
	// Source is the org.opencontainers.image.source annotation (the
	// repository URL the bundle was built from), if known.
	Source string
	// MountFrom is a repository on the same registry that may already hold
	// the wheels: blobs are mounted from it instead of uploaded.
	MountFrom string
	// ScanCache is the scan cache file for wheels not yet checked
	// (from List); empty: no cache.
	ScanCache string
	Progress  Progress
	Logger    *slog.Logger
}

// PushResult is what Push did.
type PushResult struct {
	Reference   string            `json:"reference"` // REPO@sha256:...
	Tag         string            `json:"tag,omitempty"`
	Digest      string            `json:"digest"`
	Annotations map[string]string `json:"annotations"`
	Wheels      []Wheel           `json:"wheels"`
	// LayerBytesSent counts wheel bytes read for upload; an unchanged
	// re-push sends none.
	LayerBytesSent int64 `json:"layerBytesSent"`
	BlobsUploaded  int   `json:"blobsUploaded"`
	BlobsSkipped   int   `json:"blobsSkipped"`
}

// Push uploads wheels (from List or Scan) as a bundle to ref. Wheels not
// yet checked are checked as they go; blobs go first, in parallel; the
// manifest — and so the tag — goes last, only once every wheel passed and
// every blob is in the registry, so a tag never points to a partial or
// broken bundle. Bad wheels come back as a *WheelhouseError.
// FieldMountFrom is the field of the errors about the repository blobs
// are mounted from (*fielderr.Error).
const FieldMountFrom = "mount source"

func Push(ctx context.Context, ref string, wheels []Wheel, o PushOptions) (PushResult, error) {
	log := orDiscard(o.Logger)
	prog := orNop(o.Progress)
	perByte := false
	if bp, ok := prog.(interface{ WantsBytes() bool }); ok {
		perByte = bp.WantsBytes()
	}
	r, err := o.Registry.parseRef(ref)
	if err != nil {
		return PushResult{}, err
	}
	if len(wheels) == 0 {
		return PushResult{}, fmt.Errorf("pushing %s: no wheels", ref)
	}
	var mountFrom name.Repository
	if o.MountFrom != "" {
		var opts []name.Option
		if o.Registry.PlainHTTP {
			opts = append(opts, name.Insecure)
		}
		mountFrom, err = name.NewRepository(o.MountFrom, opts...)
		if err != nil {
			return PushResult{}, fielderr.New(FieldMountFrom, o.MountFrom, "%w", err)
		}
		if mountFrom.RegistryStr() != r.Context().RegistryStr() {
			return PushResult{}, fielderr.New(FieldMountFrom, o.MountFrom, "blobs mount only within one registry (%s)", r.Context().RegistryStr())
		}
	}

	wheels = append([]Wheel(nil), wheels...)
	for _, w := range wheels {
		if w.path == "" {
			return PushResult{}, fmt.Errorf("wheel %s: no file on disk (use List or Scan)", w.File)
		}
	}
	if err := o.Registry.checkTLS(ctx, r.Context().Registry); err != nil {
		return PushResult{}, fmt.Errorf("pushing %s: %w", ref, err)
	}
	pusher, err := remote.NewPusher(o.Registry.remoteOptions(ctx)...)
	if err != nil {
		return PushResult{}, fmt.Errorf("pushing %s: %w", ref, explain(err))
	}
	repo := r.Context()
	var sent atomic.Int64
	var uploaded, skipped atomic.Int32
	// One failed blob does not cancel the others: whatever made it into
	// the registry is skipped by the next push, so a retry sends only
	// what failed.
	var g errgroup.Group
	g.SetLimit(o.Registry.jobs())
	var errMu sync.Mutex
	var errs, problems []error
	fail := func(list *[]error, err error) {
		errMu.Lock()
		*list = append(*list, err)
		errMu.Unlock()
	}
	upload := func(title string, l v1.Layer, fl *fileLayer) error {
		var before, opensBefore int64
		if fl != nil {
			before, opensBefore = fl.sent.Load(), fl.opens.Load()
		}
		var up v1.Layer = l
		if o.MountFrom != "" {
			d, _ := l.Digest()
			up = &remote.MountableLayer{Layer: l, Reference: mountFrom.Digest(d.String())}
		}
		err := pusher.Upload(ctx, repo, up)
		if fl != nil && !fl.perByte && err == nil && fl.opens.Load() > opensBefore {
			// The kernel sent the file (sendfile); it was opened, so
			// the registry did not have it and all of it went.
			fl.sent.Add(fl.size)
			prog.Add(title, fl.size)
		}
		if fl != nil {
			prog.Done(title, err == nil && fl.sent.Load() == before, err)
		}
		if err != nil {
			d, _ := l.Digest()
			return fmt.Errorf("uploading %s (blob %s) to %s: %w", title, d, repo, explain(err))
		}
		if fl != nil {
			n := fl.sent.Load() - before
			sent.Add(n)
			if n == 0 {
				skipped.Add(1)
			} else {
				uploaded.Add(1)
			}
			log.Debug("blob done", "wheel", title, "bytes_sent", n)
		}
		return nil
	}
	// Each wheel is checked (zip, RECORD, digest) and then uploaded in
	// the same worker, so checking one overlaps uploading another. A wheel
	// that fails its check is never uploaded, and nothing is tagged.
	ck := newChecker(o.ScanCache)
	for i := range wheels {
		g.Go(func() error {
			if ctx.Err() != nil {
				return nil
			}
			w := &wheels[i]
			if w.SHA256 == "" {
				if err := ck.check(ctx, w); err != nil {
					if ctx.Err() == nil { // cancelled is not a problem of the wheel's
						fail(&problems, err)
					}
					return nil
				}
			}
			h, err := v1.NewHash("sha256:" + w.SHA256)
			if err != nil {
				fail(&problems, fmt.Errorf("wheel %s: %w", w.File, err))
				return nil
			}
			prog.Start(w.File, w.Size)
			fl := &fileLayer{path: w.path, title: w.File, digest: h, size: w.Size, prog: prog, perByte: perByte}
			if err := upload(w.File, fl, fl); err != nil {
				fail(&errs, err)
			}
			return nil
		})
	}
	_ = g.Wait()
	_ = ck.cache.save()
	if len(problems) > 0 {
		return PushResult{}, &WheelhouseError{Dir: filepath.Dir(wheels[0].path), Problems: problems}
	}
	if err := ctx.Err(); err != nil && len(errs) == 0 {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return PushResult{}, fmt.Errorf("pushing %s: %w (nothing was tagged; a re-run sends only the missing blobs)", ref, errors.Join(errs...))
	}

	// Every wheel is in the registry: the lock, config and manifest last.
	lock := Lock{SchemaVersion: 1, Python: o.Python, Fingerprint: o.Fingerprint, Wheels: wheels}
	lockBytes, err := lock.marshal()
	if err != nil {
		return PushResult{}, err
	}
	lockLayer := static.NewLayer(lockBytes, LockMediaType)
	lockDigest, _ := lockLayer.Digest()
	config := static.NewLayer([]byte(EmptyConfig), EmptyMediaType)
	configDigest, _ := config.Digest()
	for _, l := range []struct {
		title string
		layer v1.Layer
	}{{EmptyMediaType, config}, {LockFile, lockLayer}} {
		g.Go(func() error {
			if err := upload(l.title, l.layer, nil); err != nil {
				fail(&errs, err)
			}
			return nil
		})
	}

	annotations := map[string]string{AnnotationCreated: now().Format(time.RFC3339)}
	if o.Source != "" {
		annotations[AnnotationSource] = o.Source
	}
	if o.Fingerprint != "" {
		annotations[AnnotationFingerprint] = o.Fingerprint
	}
	if o.Python != "" {
		annotations[AnnotationPython] = o.Python
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  ArtifactType,
		Config:        v1.Descriptor{MediaType: EmptyMediaType, Size: int64(len(EmptyConfig)), Digest: configDigest, Data: []byte(EmptyConfig)},
		Annotations:   annotations,
	}
	for _, w := range wheels {
		h, _ := v1.NewHash("sha256:" + w.SHA256)
		m.Layers = append(m.Layers, v1.Descriptor{
			MediaType: WheelMediaType, Size: w.Size, Digest: h,
			Annotations: map[string]string{AnnotationTitle: w.File},
		})
	}
	m.Layers = append(m.Layers, v1.Descriptor{
		MediaType: LockMediaType, Size: int64(len(lockBytes)), Digest: lockDigest,
		Annotations: map[string]string{AnnotationTitle: LockFile},
	})
	raw, err := json.Marshal(m)
	if err != nil {
		return PushResult{}, err
	}
	_ = g.Wait()
	if err := ctx.Err(); err != nil && len(errs) == 0 {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return PushResult{}, fmt.Errorf("pushing %s: %w (nothing was tagged; a re-run sends only the missing blobs)", ref, errors.Join(errs...))
	}
	if err := pusher.Put(ctx, r, rawManifest(raw)); err != nil {
		return PushResult{}, fmt.Errorf("pushing %s: writing the manifest: %w", ref, explain(err))
	}
	digest, _, _ := v1.SHA256(bytes.NewReader(raw))
	res := PushResult{
		Reference:      repo.Digest(digest.String()).String(),
		Digest:         digest.String(),
		Annotations:    annotations,
		Wheels:         wheels,
		LayerBytesSent: sent.Load(),
		BlobsUploaded:  int(uploaded.Load()),
		BlobsSkipped:   int(skipped.Load()),
	}
	if t, ok := r.(name.Tag); ok {
		res.Tag = t.TagStr()
	}
	return res, nil
}

type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// fileLayer is a wheel read from disk each time it is sent; its digest and
// size come from Scan, so nothing is read when the registry has the blob.
type fileLayer struct {
	path   string
	title  string
	digest v1.Hash
	size   int64
	prog   Progress
	sent   atomic.Int64
	// perByte: the progress shows a bar, so every read is counted on
	// its way. Otherwise the bare *os.File goes to net/http, which hands
	// it to sendfile(2) (strace shows it): no copy through user space,
	// about a fifth of push's CPU (most of the rest is hashing), which a
	// registry on the same machine can use instead.
	perByte bool
	opens   atomic.Int64
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return WheelMediaType, nil }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	return l.Compressed()
}

func (l *fileLayer) Compressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, fmt.Errorf("wheel %s: %w", l.title, err)
	}
	l.opens.Add(1)
	if !l.perByte {
		return f, nil
	}
	return &countingFile{f: f, l: l}, nil
}

type countingFile struct {
	f *os.File
	l *fileLayer
}

func (c *countingFile) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	if n > 0 {
		c.l.sent.Add(int64(n))
		c.l.prog.Add(c.l.title, int64(n))
	}
	return n, err
}

func (c *countingFile) Close() error { return c.f.Close() }
