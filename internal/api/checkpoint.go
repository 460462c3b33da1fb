package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Checkpoints travel with a run's records (RECORD_KIND_CHECKPOINT), so
// they get the spool's durability, the lease's fencing and the broker's
// exactly-once storage for free, and a run lost mid-run can resume on
// another node from its newest checkpoint (--resume-elsewhere). One
// record holds one chunk: a JSON header line, then the chunk's bytes.

const (
	// CheckpointChunk is the size of one checkpoint record's payload.
	CheckpointChunk = 1 << 20
	// MaxCheckpointBytes bounds a checkpoint that is shipped; a larger
	// one stays on its node (resume-elsewhere then starts over, and the
	// agent says so). A deployment with larger checkpoints puts
	// GPUPASS_CHECKPOINT_DIR on storage every node shares instead.
	MaxCheckpointBytes = 64 << 20
)

// CheckpointHeader says which file a chunk belongs to and where.
type CheckpointHeader struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Offset int64  `json:"offset"`
}

// CheckpointChunks splits a checkpoint file's content into record data.
func CheckpointChunks(name string, data []byte) [][]byte {
	sum := sha256.Sum256(data)
	h := CheckpointHeader{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	var out [][]byte
	for off := 0; off == 0 || off < len(data); off += CheckpointChunk {
		end := min(off+CheckpointChunk, len(data))
		h.Offset = int64(off)
		b, _ := json.Marshal(h)
		rec := make([]byte, 0, len(b)+1+end-off)
		rec = append(append(append(rec, b...), '\n'), data[off:end]...)
		out = append(out, rec)
	}
	return out
}

// CheckpointName checks a shipped checkpoint's name: a plain file name,
// so writing it into a work dir cannot leave that dir.
func CheckpointName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) || filepath.Base(name) != name || strings.HasPrefix(name, ".") {
		return fmt.Errorf("checkpoint name %q: want a plain file name", name)
	}
	return nil
}

// CheckpointAssembler rebuilds checkpoints from chunk records fed in seq
// order; Newest is the last one complete with a matching digest.
type CheckpointAssembler struct {
	cur     CheckpointHeader
	buf     []byte
	newest  string
	content []byte
}

// Add feeds one chunk record. A chunk that does not continue the current
// checkpoint starts over (an earlier one was cut short by a lost node).
func (a *CheckpointAssembler) Add(data []byte) error {
	i := bytes.IndexByte(data, '\n')
	if i < 0 {
		return errors.New("checkpoint record has no header line")
	}
	var h CheckpointHeader
	if err := json.Unmarshal(data[:i], &h); err != nil {
		return fmt.Errorf("checkpoint record header: %w", err)
	}
	if err := CheckpointName(h.Name); err != nil {
		return err
	}
	if h.Size < 0 || h.Size > MaxCheckpointBytes {
		return fmt.Errorf("checkpoint %s: size %d is outside 0..%d", h.Name, h.Size, MaxCheckpointBytes)
	}
	body := data[i+1:]
	if h.Offset == 0 {
		a.cur, a.buf = h, make([]byte, 0, h.Size)
	} else if h.Name != a.cur.Name || h.SHA256 != a.cur.SHA256 || h.Offset != int64(len(a.buf)) {
		a.buf = nil
		return nil
	}
	if a.buf == nil || int64(len(a.buf)+len(body)) > h.Size {
		a.buf = nil
		return nil
	}
	a.buf = append(a.buf, body...)
	if int64(len(a.buf)) == h.Size {
		sum := sha256.Sum256(a.buf)
		if hex.EncodeToString(sum[:]) == h.SHA256 {
			a.newest, a.content = h.Name, a.buf
		}
		a.buf = nil
	}
	return nil
}

// Newest returns the newest complete checkpoint ("" when none).
func (a *CheckpointAssembler) Newest() (name string, data []byte) { return a.newest, a.content }
