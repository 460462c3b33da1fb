package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/events"
)

// ckptShipper sends a run's newest checkpoint file to the broker, through
// the run's spool, each time a new one appears, so that when this node is
// lost mid-run the run can resume on another node from it
// (--resume-elsewhere). A real multi-node deployment has no shared disk
// between nodes in different clouds; the broker is the one place both
// reach. Only plain files up to api.MaxCheckpointBytes travel; a bigger
// checkpoint (or a checkpoint directory) stays here, and an event says so.
type ckptShipper struct {
	dir string
	app executor.Appender
	log *slog.Logger
	// settle is how long a file must be unchanged before it is read, for
	// trainers that do not write checkpoints atomically.
	settle time.Duration
	last   string // name, size and mtime of what was shipped (or refused)
	// runAs is the job's user (--run-as), whose files alone are read.
	runAs *executor.RunAs
}

// skip marks a file as shipped already (the checkpoint a resumed run
// starts from came from the broker).
func (c *ckptShipper) skip(path string) {
	if info, err := os.Stat(path); err == nil {
		c.last = shipKey(info)
	}
}

func shipKey(info os.FileInfo) string {
	return fmt.Sprintf("%s|%d|%d", info.Name(), info.Size(), info.ModTime().UnixNano())
}

func (c *ckptShipper) tick(now time.Time) {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return // not created yet
	}
	var best os.FileInfo
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || strings.HasSuffix(n, ".tmp") || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < c.settle {
			continue
		}
		if best == nil || info.ModTime().After(best.ModTime()) || (info.ModTime().Equal(best.ModTime()) && n > best.Name()) {
			best = info
		}
	}
	if best == nil {
		return
	}
	key := shipKey(best)
	if key == c.last || api.CheckpointName(best.Name()) != nil {
		return
	}
	c.last = key
	if best.Size() > api.MaxCheckpointBytes {
		c.event(events.Warn, fmt.Sprintf("%s is %d bytes, over the %d shipped to the broker: if this node is lost, the run cannot resume from it elsewhere", best.Name(), best.Size(), api.MaxCheckpointBytes), best.Name())
		return
	}
	data, err := c.read(filepath.Join(c.dir, best.Name()), best.Size())
	if errors.Is(err, errChanged) || errors.Is(err, fs.ErrNotExist) {
		c.last = "" // changed or went away under us: look again next time
		return
	}
	if err != nil {
		c.event(events.Warn, fmt.Sprintf("%s not shipped: %v", best.Name(), err), best.Name())
		return
	}
	chunks := api.CheckpointChunks(best.Name(), data)
	recs := make([]spool.Record, len(chunks))
	for i, ch := range chunks {
		recs[i] = spool.Record{Kind: spool.KindCheckpoint, Data: ch}
	}
	if _, _, err := c.app.Append(recs...); err != nil {
		c.log.Warn("spooling checkpoint", "checkpoint", best.Name(), "err", err)
		c.last = ""
		return
	}
	c.event(events.Info, fmt.Sprintf("%s (%d bytes) shipped for resuming elsewhere", best.Name(), len(data)), best.Name())
}

// read reads a checkpoint of size bytes, only as a regular file of the
// job's user (executor.RunAs.OpenJobFile): the job may swap the entry
// the dir listing showed for a link to the agent's key between the
// listing and the read.
func (c *ckptShipper) read(path string, size int64) ([]byte, error) {
	f, fi, err := c.runAs.OpenJobFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi.Size() != size {
		return nil, errChanged
	}
	data, err := io.ReadAll(io.LimitReader(f, size+1))
	if err == nil && int64(len(data)) != size {
		err = errChanged
	}
	return data, err
}

var errChanged = errors.New("checkpoint changed while read")

func (c *ckptShipper) event(level events.Level, msg, name string) {
	e := events.Event{Time: events.Now(), Level: level, Component: "checkpoint", Message: msg, Fields: map[string]string{"checkpoint": name}}
	if _, _, err := c.app.Append(spool.Record{Kind: spool.KindEvent, Data: e.AppendJSON(nil)}); err != nil {
		c.log.Warn("spooling checkpoint event", "err", err)
	}
}

// placeCheckpoint writes the checkpoint a resumed run starts from into its
// checkpoint dir and returns its path.
func placeCheckpoint(workDir, name string, data []byte) (string, error) {
	if err := api.CheckpointName(name); err != nil {
		return "", fmt.Errorf("resuming: %w", err)
	}
	dir := filepath.Join(workDir, "checkpoints")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("resuming: %w", err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return "", fmt.Errorf("resuming: writing checkpoint %s: %w", path, err)
	}
	return path, nil
}
