package metrics

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"sort"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// TensorBoard event files are TFRecord streams of Event protos. The
// message layouts are decoded by hand with protowire (field numbers from
// tensorflow/core/util/event.proto and framework/summary.proto,
// tensor.proto) so gpupass does not carry TensorFlow's generated code.
const (
	eventWallTime   = 1 // double
	eventStep       = 2 // int64
	eventSummary    = 5 // Summary
	eventSessionLog = 7 // SessionLog

	summaryValue = 1 // repeated Summary.Value

	valueTag         = 1 // string
	valueSimpleValue = 2 // float
	valueTensor      = 8 // TensorProto

	tensorDtype         = 1 // DataType
	tensorContent       = 4 // bytes
	tensorFloatVal      = 5 // repeated float
	tensorDoubleVal     = 6 // repeated double
	dtFloat, dtDouble   = 1, 2
	sessionLogStatus    = 1
	sessionLogStart     = 1
	maxTFRecordLen      = 64 << 20
	tfrecordHeaderBytes = 12
)

// castagnoli is made on first use: building the table costs every
// process that links this package start-up time, and most never read an
// event file.
var castagnoli = sync.OnceValue(func() *crc32.Table { return crc32.MakeTable(crc32.Castagnoli) })

// MaskedCRC is TFRecord's masked CRC32C of b.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli())
	return ((c >> 15) | (c << 17)) + 0xa282ead8
}

// tbState keeps the points of one tag: the metric asked for, or else the
// tag pickLoss would choose among the tags seen so far. A later tag can
// displace that choice, but a tag it cannot pick now it never will, so a
// file with many tags (per-layer gradient norms) costs memory for one.
type tbState struct {
	metric   string          // the tag asked for; "" picks the loss
	keep     string          // the tag whose points pts holds
	pts      []Point         // points of keep
	tags     map[string]bool // every tag seen, for order
	order    []string        // every tag in order of appearance, for messages
	restarts int
	seen     bool
}

func newTBState(metric string) *tbState {
	return &tbState{metric: metric, keep: metric, tags: map[string]bool{}}
}

// ReadTensorBoard reads scalar summaries from one TensorBoard event file.
// A truncated last record (a writer still running) and records with a bad
// CRC are reported as problems; a corrupt length stops the file there.
func ReadTensorBoard(r io.Reader, source string, opt Options) (*Series, error) {
	st := newTBState(opt.Metric)
	var probs Problems
	if err := st.read(r, source, &probs); err != nil {
		return nil, err
	}
	return st.series(source, opt, probs)
}

// ReadTensorBoardFiles reads several event files of one run (a run
// directory often holds one per restart) in the given order.
func ReadTensorBoardFiles(open func(name string) (io.ReadCloser, error), names []string, source string, opt Options) (*Series, error) {
	st := newTBState(opt.Metric)
	var probs Problems
	for _, n := range names {
		f, err := open(n)
		if err != nil {
			return nil, err
		}
		err = st.read(f, n, &probs)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return st.series(source, opt, probs)
}

func (st *tbState) series(source string, opt Options, probs Problems) (*Series, error) {
	// st.keep is opt.Metric, or pickLoss(st.order).
	metric, pts := st.keep, st.pts
	if len(pts) == 0 {
		e := &EmptyError{Source: source, Metric: metric, Problems: probs}
		if metric == "" && len(st.order) > 0 {
			sorted := append([]string(nil), st.order...)
			sort.Strings(sorted)
			return nil, &fielderr.Error{Field: FieldMetric, Problem: fmt.Sprintf("is required for %s: it has no loss tag among %v; choose one of them", source, sorted)}
		}
		return nil, e
	}
	s := &Series{Source: source, Metric: metric, Format: "tensorboard", Points: pts, Problems: probs, Restarts: st.restarts}
	s.Normalize()
	return s, nil
}

func (st *tbState) read(r io.Reader, name string, probs *Problems) error {
	br := bufio.NewReaderSize(r, 1<<16)
	var hdr [tfrecordHeaderBytes]byte
	var buf []byte
	var off int64
	for rec := 1; ; rec++ {
		where := fmt.Sprintf("%s: record %d at byte %d", name, rec, off)
		n, err := io.ReadFull(br, hdr[:])
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			probs.Add(where, fmt.Sprintf("truncated record header (%d of 12 bytes; file cut or still being written)", n))
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
		length := binary.LittleEndian.Uint64(hdr[:8])
		if MaskedCRC(hdr[:8]) != binary.LittleEndian.Uint32(hdr[8:12]) {
			probs.Add(where, "length CRC mismatch: corrupt record framing, rest of file skipped")
			return nil
		}
		if length > maxTFRecordLen {
			probs.Add(where, fmt.Sprintf("record length %d over %d bytes: rest of file skipped", length, maxTFRecordLen))
			return nil
		}
		if cap(buf) < int(length)+4 {
			buf = make([]byte, int(length)+4)
		}
		buf = buf[:int(length)+4]
		if n, err := io.ReadFull(br, buf); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
				probs.Add(where, fmt.Sprintf("truncated record (%d of %d bytes; file cut or still being written)", n, len(buf)))
				return nil
			}
			return fmt.Errorf("reading %s: %w", name, err)
		}
		off += tfrecordHeaderBytes + int64(length) + 4
		data := buf[:length]
		if MaskedCRC(data) != binary.LittleEndian.Uint32(buf[length:]) {
			probs.Add(where, "data CRC mismatch: record skipped")
			continue
		}
		if err := st.event(data); err != nil {
			probs.Add(where, "bad Event proto: "+err.Error())
		}
	}
}

// event decodes one Event and keeps its scalar values.
func (st *tbState) event(b []byte) error {
	var wall float64
	var step int64
	var summaries [][]byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == eventWallTime && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			wall = math.Float64frombits(v)
			b = b[n:]
		case num == eventStep && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			step = int64(v)
			b = b[n:]
		case num == eventSummary && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			summaries = append(summaries, v)
			b = b[n:]
		case num == eventSessionLog && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if sessionStatus(v) == sessionLogStart && st.seen {
				st.restarts++
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	// A wall time that is not a representable time leaves the time
	// unknown (0).
	t, _ := epochNanos(wall)
	for _, s := range summaries {
		if err := st.summary(s, step, t); err != nil {
			return err
		}
	}
	return nil
}

func sessionStatus(b []byte) uint64 {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0
		}
		b = b[n:]
		if num == sessionLogStatus && typ == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(b)
			return v
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0
		}
		b = b[n:]
	}
	return 0
}

func (st *tbState) summary(b []byte, step, t int64) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num == summaryValue && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if err := st.value(v, step, t); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

func (st *tbState) value(b []byte, step, t int64) error {
	var tag string
	var val float64
	has := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == valueTag && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			tag = string(v)
			b = b[n:]
		case num == valueSimpleValue && typ == protowire.Fixed32Type:
			v, n := protowire.ConsumeFixed32(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			val, has = float64(math.Float32frombits(v)), true
			b = b[n:]
		case num == valueTensor && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if f, ok := tensorScalar(v); ok {
				val, has = f, true
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	if !has || tag == "" {
		return nil
	}
	if step > MaxStep || step < -MaxStep {
		return fmt.Errorf("step %d out of range", step)
	}
	if !st.tags[tag] {
		st.tags[tag] = true
		st.order = append(st.order, tag)
		if st.metric == "" && tag != st.keep && pickLoss([]string{st.keep, tag}) == tag {
			st.keep, st.pts = tag, nil
		}
	}
	if tag == st.keep {
		st.pts = append(st.pts, Point{Step: step, Value: val, Time: t})
	}
	st.seen = true
	return nil
}

// tensorScalar reads a scalar float or double TensorProto (TF2's
// tf.summary.scalar writes these instead of simple_value).
func tensorScalar(b []byte) (float64, bool) {
	var dtype uint64
	var content []byte
	var f float64
	has := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		switch {
		case num == tensorDtype && typ == protowire.VarintType:
			dtype, n = protowire.ConsumeVarint(b)
		case num == tensorContent && typ == protowire.BytesType:
			content, n = protowire.ConsumeBytes(b)
		case num == tensorFloatVal && typ == protowire.BytesType:
			var p []byte
			p, n = protowire.ConsumeBytes(b)
			if len(p) >= 4 {
				f, has = float64(math.Float32frombits(binary.LittleEndian.Uint32(p))), true
			}
		case num == tensorFloatVal && typ == protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			f, has = float64(math.Float32frombits(v)), true
		case num == tensorDoubleVal && typ == protowire.BytesType:
			var p []byte
			p, n = protowire.ConsumeBytes(b)
			if len(p) >= 8 {
				f, has = math.Float64frombits(binary.LittleEndian.Uint64(p)), true
			}
		case num == tensorDoubleVal && typ == protowire.Fixed64Type:
			var v uint64
			v, n = protowire.ConsumeFixed64(b)
			f, has = math.Float64frombits(v), true
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return 0, false
		}
		b = b[n:]
	}
	if has {
		return f, true
	}
	switch {
	case dtype == dtFloat && len(content) == 4:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(content))), true
	case dtype == dtDouble && len(content) == 8:
		return math.Float64frombits(binary.LittleEndian.Uint64(content)), true
	}
	return 0, false
}
