// Package bundle moves Python wheelhouses in and out of OCI registries as
// OCI 1.1 artifacts, so that nodes without internet install exactly the
// wheels a spec pins, by digest, verified on the way in.
//
// A bundle is one image manifest with gpupass's ArtifactType, the empty
// config descriptor, one layer per wheel (titled with the wheel's file
// name) and a lock layer that lists each wheel's name, version, tags,
// sha256 and size. Files are streamed from and to disk: a wheel is never
// held whole in memory. The package prints nothing; callers pass a
// Progress and a *slog.Logger when they want to see what happens.
package bundle

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gpupass/gpupass/internal/wheel"
)

// Media types and annotations of a gpupass bundle.
const (
	ArtifactType   = "application/vnd.gpupass.bundle.v1"
	WheelMediaType = "application/vnd.gpupass.wheel.v1+zip"
	LockMediaType  = "application/vnd.gpupass.bundle.lock.v1+json"
	// EmptyMediaType and EmptyConfig are the OCI 1.1 empty descriptor an
	// artifact uses as its config.
	EmptyMediaType = "application/vnd.oci.empty.v1+json"
	EmptyConfig    = "{}"

	AnnotationTitle       = "org.opencontainers.image.title"
	AnnotationCreated     = "org.opencontainers.image.created"
	AnnotationSource      = "org.opencontainers.image.source"
	AnnotationFingerprint = "dev.gpupass.spec.fingerprint"
	AnnotationPython      = "dev.gpupass.python"

	// LockFile is the title of the lock layer; pull writes it next to the
	// wheels so that a wheelhouse records what it was pulled as.
	LockFile = "gpupass-bundle.lock.json"
)

// ErrVerification marks failures where content is not what it claims to
// be (digest, size, RECORD, lock, unsafe names), as opposed to failures to
// reach or read it. Callers report it as a finding, not an I/O error.
var ErrVerification = errors.New("verification failed")

// Wheel is one wheel of a wheelhouse or bundle, as the lock lists it.
type Wheel struct {
	File    string   `json:"file"`
	Name    string   `json:"name"`
	Version string   `json:"version"`
	Tags    []string `json:"tags"`
	SHA256  string   `json:"sha256"` // hex
	Size    int64    `json:"size"`

	path string // on disk, when scanned from a wheelhouse
}

// Lock is the content of the lock layer.
type Lock struct {
	SchemaVersion int     `json:"schemaVersion"`
	Python        string  `json:"python,omitempty"`
	Fingerprint   string  `json:"fingerprint,omitempty"`
	Wheels        []Wheel `json:"wheels"`
}

func (l Lock) marshal() ([]byte, error) {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func parseLock(b []byte) (Lock, error) {
	var l Lock
	if err := json.Unmarshal(b, &l); err != nil {
		return Lock{}, fmt.Errorf("lock layer %s: %w", LockFile, err)
	}
	if l.SchemaVersion != 1 {
		return Lock{}, fmt.Errorf("lock layer %s: schemaVersion %d, this gpupass reads 1", LockFile, l.SchemaVersion)
	}
	return l, nil
}

func tagStrings(tags []wheel.Tag) []string {
	out := make([]string, len(tags))
	for i, t := range tags {
		out[i] = t.String()
	}
	return out
}

// Progress hears about each blob as it moves. Implementations must be
// safe for concurrent use: blobs move in parallel.
type Progress interface {
	// Start: a blob of size bytes begins to move.
	Start(name string, size int64)
	// Add: n more bytes of it moved.
	Add(name string, n int64)
	// Done: it finished; skipped means the registry already had it (or it
	// was mounted), so no bytes were sent.
	Done(name string, skipped bool, err error)
}

type nopProgress struct{}

func (nopProgress) Start(string, int64)      {}
func (nopProgress) Add(string, int64)        {}
func (nopProgress) Done(string, bool, error) {}

func orNop(p Progress) Progress {
	if p == nil {
		return nopProgress{}
	}
	return p
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// now is replaced in tests.
var now = func() time.Time { return time.Now().UTC() }
