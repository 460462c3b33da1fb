// Package spool is the agent's on-disk spool of one run: events and metric
// points are appended here first, read back with Pending for upload and
// deleted with Ack once the broker has acknowledged them. It survives a
// crash of the agent (kill -9) without losing anything Append returned,
// detects and cuts a torn write at the tail on reopen, and on a full disk
// returns an error naming the spool while keeping what it holds readable.
//
// Layout of a spool directory:
//
//	LOCK                      flock(2) held while open: one writer per spool
//	ACK                       highest acknowledged seq, replaced atomically
//	MARK                      the appender's mark (AppendMarked), replaced atomically
//	00000000000000000001.seg  segments named after their first seq
//
// A segment is a sequence of frames:
//
//	uint32 LE  length of body
//	uint32 LE  CRC-32C (Castagnoli) of body
//	body:      kind (1 byte) | seq (uint64 LE) | data
//
// Seqs are assigned by Append, start at 1 and have no gaps; events and
// metric points of a run share the sequence.
package spool

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpupass/gpupass/internal/fsutil"
)

// Kind says what a record holds.
type Kind uint8

// Record kinds.
const (
	KindEvent  Kind = 1
	KindMetric Kind = 2
	// KindCheckpoint is a chunk of a checkpoint file (internal/api).
	KindCheckpoint Kind = 3
)

// Record is one spooled item. Data is opaque to the spool (the executor
// stores JSON).
type Record struct {
	Seq  uint64
	Kind Kind
	Data []byte
}

// SyncPolicy says when appended records reach stable storage.
type SyncPolicy int

const (
	// SyncInterval (the default): Append returns once its records are
	// written to the segment file, which a kill -9 of the agent cannot
	// undo; a background group commit fsyncs every Options.SyncInterval,
	// bounding what a power loss can take.
	SyncInterval SyncPolicy = iota
	// SyncAlways: Append returns after an fsync covering its records.
	// Appenders running at the same time share one fsync (group commit),
	// so callers that batch keep the rate high.
	SyncAlways
)

// Options tune a spool.
type Options struct {
	// SegmentSize is the size past which a new segment is started
	// (default 8 MiB). Acknowledged segments are deleted whole.
	SegmentSize int64
	Sync        SyncPolicy
	// SyncInterval is the group-commit period of SyncInterval (default
	// 50ms).
	SyncInterval time.Duration

	// write replaces (*os.File).Write in tests that inject a full disk.
	write func(f *os.File, b []byte) (int, error)
}

const (
	headerSize = 8
	bodyHead   = 9
	// MaxData bounds one record's data; the executor cuts lines far
	// below it. A larger length field on reopen marks a torn frame.
	MaxData = 4 << 20
	// pendingBytes bounds one Pending answer.
	pendingBytes = 4 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type segment struct {
	path        string
	first, last uint64 // last < first when empty
	size        int64
}

// Spool is an open spool. It is safe for concurrent use.
type Spool struct {
	dir  string
	opts Options
	lock *os.File

	mu        sync.Mutex
	segs      []*segment // by first seq; the last one is active
	active    *os.File
	nextSeq   uint64
	acked     uint64
	buf       []byte
	broken    error
	closed    bool
	truncated int64
	cursor    cursor

	syncMu  sync.Mutex
	written atomic.Uint64 // highest seq written to a file
	synced  atomic.Uint64 // highest seq fsynced

	stop chan struct{}
	done chan struct{}

	// mark is the mark of the newest batch the spool holds (AppendMarked).
	mark []byte
}

// markFile is MARK: written before the frames of its batch, so that
// after a crash the spool tells from its own tail which of the two marks
// holds: Mark once the records through Seq are in, Prev before.
type markFile struct {
	Seq  uint64 `json:"seq"`
	Mark []byte `json:"mark"`
	Prev []byte `json:"prev,omitempty"`
}

// Stats describe a spool.
type Stats struct {
	Dir string `json:"dir"`
	// LastSeq is the seq of the newest record, Acked the highest
	// acknowledged; Pending = LastSeq - Acked.
	LastSeq  uint64 `json:"last_seq"`
	Acked    uint64 `json:"acked"`
	Pending  uint64 `json:"pending"`
	Segments int    `json:"segments"`
	Bytes    int64  `json:"bytes"`
	// TruncatedBytes is what Open cut from a torn tail.
	TruncatedBytes int64 `json:"truncated_bytes,omitempty"`
}

// CorruptError says a frame before the tail is damaged: not a torn write,
// which Open repairs, but damage it must not guess about.
type CorruptError struct {
	Path   string
	Offset int64
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("spool segment %s is corrupt at byte %d: %s; move the file away to drop its records, or restore it", e.Path, e.Offset, e.Reason)
}

// Open opens (creating if needed) the spool in dir, recovering from a
// crash: a torn frame at the end of the newest segment is truncated away.
func Open(dir string, opts Options) (*Spool, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = 8 << 20
	}
	if opts.SyncInterval <= 0 {
		opts.SyncInterval = 50 * time.Millisecond
	}
	if opts.write == nil {
		opts.write = (*os.File).Write
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("opening spool %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening spool %s: %w", dir, err)
	}
	if err := flockWait(lock, lockWait); err != nil {
		lock.Close()
		return nil, fmt.Errorf("opening spool %s: another process holds it (%w): is a second gpupass-agent running with the same --state-dir? Stop it, or give each agent its own", dir, err)
	}
	s := &Spool{dir: dir, opts: opts, lock: lock, stop: make(chan struct{}), done: make(chan struct{})}
	if err := s.recover(); err != nil {
		s.closeFiles()
		return nil, err
	}
	go s.syncLoop()
	return s, nil
}

func (s *Spool) recover() error {
	ack, err := readAck(filepath.Join(s.dir, "ACK"))
	if err != nil {
		return fmt.Errorf("opening spool %s: %w", s.dir, err)
	}
	s.acked = ack
	names, err := filepath.Glob(filepath.Join(s.dir, "*.seg"))
	if err != nil {
		return fmt.Errorf("opening spool %s: %w", s.dir, err)
	}
	sort.Strings(names) // zero-padded names sort by first seq
	expect := uint64(0)
	for i, path := range names {
		first, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(path), ".seg"), 10, 64)
		if err != nil {
			return fmt.Errorf("opening spool %s: unexpected file %s: remove it", s.dir, path)
		}
		if expect == 0 {
			expect = first
		}
		seg, err := scanSegment(path, first, expect, i == len(names)-1)
		if err != nil {
			return err
		}
		s.truncated += seg.truncated
		if seg.last >= seg.first {
			expect = seg.last + 1
		}
		s.segs = append(s.segs, &seg.segment)
	}
	s.nextSeq = max(expect, ack+1, 1)
	if len(s.segs) > 0 && s.segs[len(s.segs)-1].last >= s.segs[len(s.segs)-1].first {
		s.nextSeq = max(s.nextSeq, s.segs[len(s.segs)-1].last+1)
	}
	s.written.Store(s.nextSeq - 1)
	s.synced.Store(s.nextSeq - 1)
	if err := s.recoverMark(); err != nil {
		return err
	}
	// A crash between writing ACK and deleting segments leaves acked
	// segments behind.
	if _, err := s.dropAcked(); err != nil {
		return err
	}
	if len(s.segs) == 0 || s.segs[len(s.segs)-1].size >= s.opts.SegmentSize {
		return s.newSegment()
	}
	last := s.segs[len(s.segs)-1]
	f, err := os.OpenFile(last.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening spool %s: %w", s.dir, err)
	}
	s.active = f
	return nil
}

type scanned struct {
	segment
	truncated int64
}

// scanSegment verifies every frame. A bad frame in the newest segment is
// a torn write (the agent died mid-append): the file is cut there. In an
// older segment it is corruption and an error.
func scanSegment(path string, first, expect uint64, newest bool) (scanned, error) {
	out := scanned{segment: segment{path: path, first: first, last: first - 1}}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return out, fmt.Errorf("opening spool segment %s: %w", path, err)
	}
	defer f.Close()
	if first != expect {
		return out, &CorruptError{Path: path, Offset: 0, Reason: fmt.Sprintf("starts at seq %d, expected %d (a segment is missing)", first, expect)}
	}
	st, err := f.Stat()
	if err != nil {
		return out, fmt.Errorf("opening spool segment %s: %w", path, err)
	}
	br := bufio.NewReaderSize(f, 1<<16)
	var off int64
	next := first
	for {
		rec, n, reason := readFrame(br)
		if reason == "" && rec.Seq != next {
			reason = fmt.Sprintf("seq %d where %d was expected", rec.Seq, next)
		}
		if reason == "eof" {
			break
		}
		if reason != "" {
			if !newest {
				return out, &CorruptError{Path: path, Offset: off, Reason: reason}
			}
			if err := f.Truncate(off); err != nil {
				return out, fmt.Errorf("truncating torn tail of spool segment %s at byte %d: %w", path, off, err)
			}
			if err := f.Sync(); err != nil {
				return out, fmt.Errorf("truncating torn tail of spool segment %s: %w", path, err)
			}
			out.truncated = st.Size() - off
			break
		}
		off += n
		out.last = rec.Seq
		next++
	}
	out.size = off
	return out, nil
}

// readFrame reads one frame. reason is "eof" at a clean end, another
// non-empty string for a torn or damaged frame.
func readFrame(br *bufio.Reader) (Record, int64, string) {
	var h [headerSize]byte
	n, err := io.ReadFull(br, h[:])
	if err == io.EOF {
		return Record{}, 0, "eof"
	}
	if err != nil {
		return Record{}, 0, fmt.Sprintf("short header (%d bytes)", n)
	}
	size := binary.LittleEndian.Uint32(h[0:4])
	sum := binary.LittleEndian.Uint32(h[4:8])
	if size < bodyHead || size > MaxData+bodyHead {
		return Record{}, 0, fmt.Sprintf("impossible frame length %d", size)
	}
	body := make([]byte, size)
	if n, err := io.ReadFull(br, body); err != nil {
		return Record{}, 0, fmt.Sprintf("short frame (%d of %d bytes)", n, size)
	}
	if crc32.Checksum(body, castagnoli) != sum {
		return Record{}, 0, "checksum mismatch"
	}
	return Record{Kind: Kind(body[0]), Seq: binary.LittleEndian.Uint64(body[1:9]), Data: body[bodyHead:]}, int64(headerSize) + int64(size), ""
}

func appendFrame(b []byte, r Record) []byte {
	start := len(b)
	b = append(b, make([]byte, headerSize+bodyHead)...)
	b = append(b, r.Data...)
	body := b[start+headerSize:]
	body[0] = byte(r.Kind)
	binary.LittleEndian.PutUint64(body[1:9], r.Seq)
	binary.LittleEndian.PutUint32(b[start:], uint32(len(body)))
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(body, castagnoli))
	return b
}

func readAck(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("ACK file %s holds %q, not a sequence number: delete it to resend everything", path, b)
	}
	return v, nil
}

// Append spools records, assigning each the next seq (the Seq field given
// is ignored), and returns the seqs of the first and last. On error
// nothing of this call is kept and the spool still holds, readable, all it
// held before.
func (s *Spool) Append(recs ...Record) (first, last uint64, err error) {
	if len(recs) == 0 {
		return 0, 0, nil
	}
	s.mu.Lock()
	first, last, err = s.appendLocked(recs)
	s.mu.Unlock()
	if err != nil || s.opts.Sync != SyncAlways {
		return first, last, err
	}
	if err := s.syncTo(last); err != nil {
		return first, last, err
	}
	return first, last, nil
}

func (s *Spool) appendLocked(recs []Record) (uint64, uint64, error) {
	if s.closed {
		return 0, 0, fmt.Errorf("appending to spool %s: closed", s.dir)
	}
	if s.broken != nil {
		return 0, 0, s.broken
	}
	buf := s.buf[:0]
	seq := s.nextSeq
	for _, r := range recs {
		if len(r.Data) > MaxData {
			return 0, 0, fmt.Errorf("appending to spool %s: record of %d bytes is over the %d-byte limit", s.dir, len(r.Data), MaxData)
		}
		r.Seq = seq
		buf = appendFrame(buf, r)
		seq++
	}
	s.buf = buf[:0]
	seg := s.segs[len(s.segs)-1]
	if seg.size > 0 && seg.size+int64(len(buf)) > s.opts.SegmentSize {
		if err := s.rotate(); err != nil {
			return 0, 0, err
		}
		seg = s.segs[len(s.segs)-1]
	}
	n, err := s.opts.write(s.active, buf)
	if err == nil && n < len(buf) {
		err = io.ErrShortWrite
	}
	if err != nil {
		// Cut what part of the batch reached the file, so the spool
		// stays a clean sequence of frames.
		if terr := s.active.Truncate(seg.size); terr != nil {
			s.broken = fmt.Errorf("spool %s is unusable until reopened (a torn tail is repaired then): writing failed (%v) and truncating back failed: %w", s.dir, err, terr)
		}
		return 0, 0, fmt.Errorf("appending %d records to spool %s: %w", len(recs), s.dir, err)
	}
	first := s.nextSeq
	s.nextSeq = seq
	seg.size += int64(len(buf))
	seg.last = seq - 1
	s.written.Store(seq - 1)
	return first, seq - 1, nil
}

// AppendMarked appends recs like Append and makes mark the spool's mark
// once they are in, in one step as far as a crash goes: after a kill -9
// at any point, Mark (after Open) is the mark of the newest batch whose
// records the spool holds. An appender that follows a file stores how
// far it read this way, so that it reads on after a restart without
// losing or repeating a record. mark is small (a few hundred bytes).
func (s *Spool) AppendMarked(mark []byte, recs ...Record) (first, last uint64, err error) {
	if len(recs) == 0 {
		return 0, 0, nil
	}
	s.mu.Lock()
	first, last, err = s.appendMarkedLocked(mark, recs)
	s.mu.Unlock()
	if err != nil || s.opts.Sync != SyncAlways {
		return first, last, err
	}
	if err := s.syncTo(last); err != nil {
		return first, last, err
	}
	return first, last, nil
}

func (s *Spool) appendMarkedLocked(mark []byte, recs []Record) (uint64, uint64, error) {
	if s.closed || s.broken != nil {
		return s.appendLocked(recs) // its error
	}
	// Under s.mu no other append can take these seqs: the records
	// through Seq are in the spool exactly when this batch is.
	prev := s.mark
	if err := s.writeMark(markFile{Seq: s.nextSeq + uint64(len(recs)) - 1, Mark: mark, Prev: prev}); err != nil {
		return 0, 0, err
	}
	first, last, err := s.appendLocked(recs)
	if err != nil {
		// Another appender's records may take these seqs next: the
		// file must say again that prev holds.
		if merr := s.writeMark(markFile{Seq: s.nextSeq - 1, Mark: prev}); merr != nil && s.broken == nil {
			s.broken = fmt.Errorf("spool %s is unusable until reopened: an append failed (%v) and its mark could not be taken back: %w", s.dir, err, merr)
		}
		return 0, 0, err
	}
	s.mark = append([]byte(nil), mark...)
	return first, last, nil
}

func (s *Spool) writeMark(m markFile) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("writing the mark of spool %s: %w", s.dir, err)
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(s.dir, "MARK"), b, 0o600); err != nil {
		return fmt.Errorf("writing the mark of spool %s: %w", s.dir, err)
	}
	return nil
}

// recoverMark picks the mark that holds for the records the spool has.
func (s *Spool) recoverMark() error {
	b, err := os.ReadFile(filepath.Join(s.dir, "MARK"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var m markFile
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		return fmt.Errorf("opening spool %s: reading MARK: %w (move it away to follow the run's files from the start)", s.dir, err)
	}
	if s.nextSeq-1 >= m.Seq {
		s.mark = m.Mark
		return nil
	}
	// The batch MARK names did not land: Prev holds. Say so in the file
	// before anything else is appended, or records of another writer
	// taking the batch's seqs would later make its mark look landed (a
	// crash, plain appends through seq m.Seq, a crash before the next
	// marked batch: the follower would resume past lines never spooled).
	s.mark = m.Prev
	if err := s.writeMark(markFile{Seq: s.nextSeq - 1, Mark: m.Prev}); err != nil {
		return fmt.Errorf("opening spool %s: settling the mark of a batch that did not land: %w", s.dir, err)
	}
	return nil
}

// Mark returns the mark of the newest batch AppendMarked put in the
// spool (nil when none).
func (s *Spool) Mark() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.mark...)
}

// rotate makes the active segment durable and starts a new one.
func (s *Spool) rotate() error {
	old := s.active
	if err := old.Sync(); err != nil {
		return fmt.Errorf("syncing spool %s: %w", s.dir, err)
	}
	setMax(&s.synced, s.written.Load())
	if err := s.newSegment(); err != nil {
		return err
	}
	old.Close()
	return nil
}

func (s *Spool) newSegment() error {
	path := filepath.Join(s.dir, fmt.Sprintf("%020d.seg", s.nextSeq))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("starting a segment in spool %s: %w", s.dir, err)
	}
	if err := syncDir(s.dir); err != nil {
		f.Close()
		return fmt.Errorf("starting a segment in spool %s: %w", s.dir, err)
	}
	s.active = f
	s.segs = append(s.segs, &segment{path: path, first: s.nextSeq, last: s.nextSeq - 1})
	return nil
}

func setMax(v *atomic.Uint64, n uint64) {
	for {
		cur := v.Load()
		if n <= cur || v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// syncTo returns once every record up to seq is fsynced. Whoever gets
// syncMu fsyncs for all that is written so far; the callers queued behind
// it usually find their records covered and return without an fsync.
func (s *Spool) syncTo(seq uint64) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	for s.synced.Load() < seq {
		s.mu.Lock()
		f, upTo := s.active, s.written.Load()
		s.mu.Unlock()
		if f == nil {
			return fmt.Errorf("syncing spool %s: closed", s.dir)
		}
		if err := f.Sync(); err != nil {
			if errors.Is(err, os.ErrClosed) {
				continue // rotated meanwhile; rotation synced it
			}
			return fmt.Errorf("syncing spool %s: %w", s.dir, err)
		}
		setMax(&s.synced, upTo)
	}
	return nil
}

func (s *Spool) syncLoop() {
	defer close(s.done)
	t := time.NewTicker(s.opts.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if w := s.written.Load(); w > s.synced.Load() {
				// An error here resurfaces on the next SyncAlways
				// append or on Close.
				_ = s.syncTo(w)
			}
		}
	}
}

// Sync fsyncs everything appended so far.
func (s *Spool) Sync() error { return s.syncTo(s.written.Load()) }

// Pending returns up to max records with seq > after that are not yet
// acknowledged, in seq order (at most a few MiB at once). Reading on
// from where the previous call stopped seeks straight there; frames
// before the first wanted one are skipped by their length, since seqs run
// without gaps inside a segment.
func (s *Spool) Pending(after uint64, max int) ([]Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("reading spool %s: closed", s.dir)
	}
	from := after + 1
	if from <= s.acked {
		from = s.acked + 1
	}
	var out []Record
	bytes := 0
	for _, seg := range s.segs {
		if seg.last < from || seg.last < seg.first {
			continue
		}
		f, err := os.Open(seg.path)
		if err != nil {
			return out, fmt.Errorf("reading spool %s: %w", s.dir, err)
		}
		seq, off := seg.first, int64(0)
		if c := s.cursor; c.path == seg.path && c.seq <= from && c.seq > seq {
			seq, off = c.seq, c.off
		}
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			f.Close()
			return out, fmt.Errorf("reading spool %s: %w", s.dir, err)
		}
		br := bufio.NewReaderSize(f, 1<<16)
		for ; seq <= seg.last; seq++ {
			if seq < from {
				n, err := skipFrame(br)
				if err != nil {
					f.Close()
					return out, &CorruptError{Path: seg.path, Offset: off, Reason: err.Error()}
				}
				off += n
				continue
			}
			rec, n, reason := readFrame(br)
			if reason == "" && rec.Seq != seq {
				reason = fmt.Sprintf("seq %d where %d was expected", rec.Seq, seq)
			}
			if reason != "" {
				f.Close()
				return out, &CorruptError{Path: seg.path, Offset: off, Reason: reason}
			}
			off += n
			out = append(out, rec)
			bytes += len(rec.Data)
			if len(out) >= max || bytes >= pendingBytes {
				s.cursor = cursor{path: seg.path, seq: seq + 1, off: off}
				f.Close()
				return out, nil
			}
		}
		s.cursor = cursor{path: seg.path, seq: seq, off: off}
		f.Close()
	}
	return out, nil
}

// cursor is where the last Pending stopped: the frame of seq starts at
// off in path.
type cursor struct {
	path string
	seq  uint64
	off  int64
}

func skipFrame(br *bufio.Reader) (int64, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, fmt.Errorf("short header: %w", err)
	}
	size := binary.LittleEndian.Uint32(h[0:4])
	if size < bodyHead || size > MaxData+bodyHead {
		return 0, fmt.Errorf("impossible frame length %d", size)
	}
	if _, err := br.Discard(int(size)); err != nil {
		return 0, fmt.Errorf("short frame: %w", err)
	}
	return int64(headerSize) + int64(size), nil
}

// Ack records that the broker holds every record up to seq and deletes
// the segments that holds entirely. Acking again, or lower, is a no-op.
func (s *Spool) Ack(seq uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("acknowledging in spool %s: closed", s.dir)
	}
	if seq <= s.acked {
		return nil
	}
	if seq >= s.nextSeq {
		return fmt.Errorf("acknowledging seq %d in spool %s: only %d records were appended", seq, s.dir, s.nextSeq-1)
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(s.dir, "ACK"), []byte(strconv.FormatUint(seq, 10)+"\n"), 0o600); err != nil {
		return fmt.Errorf("acknowledging seq %d in spool %s: %w", seq, s.dir, err)
	}
	s.acked = seq
	droppedActive, err := s.dropAcked()
	if err != nil {
		return err
	}
	if droppedActive {
		return s.newSegment()
	}
	return nil
}

// dropAcked deletes acknowledged segments and reports whether the active
// (newest) one went too. The active one is deleted only when it is
// entirely acknowledged and has grown past a quarter of the segment size
// (or the spool is being opened), so a long run's spool stays small
// without a new file per acknowledgement.
func (s *Spool) dropAcked() (droppedActive bool, err error) {
	var keep []*segment
	for i, seg := range s.segs {
		isActive := i == len(s.segs)-1
		full := seg.last >= seg.first && seg.last <= s.acked
		if !full || (isActive && s.active != nil && seg.size < s.opts.SegmentSize/4) {
			keep = append(keep, seg)
			continue
		}
		if isActive && s.active != nil {
			s.active.Close()
			s.active = nil
		}
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.segs = append(keep, s.segs[i:]...)
			return false, fmt.Errorf("deleting acknowledged segment of spool %s: %w", s.dir, err)
		}
		droppedActive = droppedActive || isActive
	}
	s.segs = keep
	return droppedActive, nil
}

// Stats reports the spool's state.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Dir: s.dir, LastSeq: s.nextSeq - 1, Acked: s.acked, Segments: len(s.segs), TruncatedBytes: s.truncated}
	st.Pending = st.LastSeq - min(st.Acked, st.LastSeq)
	for _, seg := range s.segs {
		st.Bytes += seg.size
	}
	return st
}

// Dir returns the spool's directory.
func (s *Spool) Dir() string { return s.dir }

// Close fsyncs and closes the spool.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	err := s.Sync()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeFiles()
	if err != nil {
		return err
	}
	return nil
}

func (s *Spool) closeFiles() {
	if s.active != nil {
		s.active.Close()
		s.active = nil
	}
	if s.lock != nil {
		s.lock.Close()
	}
}

// lockWait is how long Open waits for a spool lock that is held. A child
// this process forks (the executor starts jobs) holds a copy of every open
// descriptor until it execs, and with it the lock of a spool closed in that
// moment: such a holder lets go within milliseconds, another agent never.
const lockWait = 2 * time.Second

// flockWait takes an exclusive flock on f, trying again until wait has
// passed while someone else holds it.
func flockWait(f *os.File, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil || !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
