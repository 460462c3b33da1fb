package sqlstore

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/gpupass/gpupass/broker/store"
)

// Decoding the stored index. A broker's first registry read decodes one
// index per node: at 100,000 nodes encoding/json (reflection, a validity
// pass, a string per field) was a third of a 7 s read and most of its 4.5
// million allocations. decodeIndex reads the form SaveReport writes,
// field by field, and shares the strings that repeat across a fleet
// (GPU name, driver and CUDA versions, regions…). Anything else it meets
// (a key it does not know exactly, null, an escaped string, a number that
// is not plainly one) makes it give up, and the caller decodes that row
// with encoding/json as before: the stored format stays what it was, and
// a row decodes to what encoding/json makes of it.

// interner shares equal strings between the nodes of one read.
type interner struct {
	m map[string]string
}

// maxInterned bounds the strings one read shares: values that repeat are
// few (tens per field in a fleet); past the bound, new values are copied.
const maxInterned = 4096

func newInterner() *interner { return &interner{m: make(map[string]string, 256)} }

// bytes returns b as a string, shared with earlier equal ones.
func (in *interner) bytes(b []byte) string {
	if s, ok := in.m[string(b)]; ok { // no allocation for the lookup
		return s
	}
	s := string(b)
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	return s
}

// string returns s, or an equal string read earlier (so that s, freshly
// allocated by the driver, can be collected).
func (in *interner) string(s string) string {
	if t, ok := in.m[s]; ok {
		return t
	}
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	return s
}

// zeroTime is how SaveReport's JSON writes the GeneratedAt it clears (the
// time is kept as generated_at_ns).
const zeroTime = "0001-01-01T00:00:00Z"

// readIndex decodes a stored index.
func readIndex(data []byte, in *interner) (store.NodeIndex, error) {
	var ix index
	if !decodeIndex(data, &ix, in) {
		ix = index{}
		if err := json.Unmarshal(data, &ix); err != nil {
			return store.NodeIndex{}, err
		}
	}
	return ix.nodeIndex(), nil
}

// decodeIndex decodes a stored index into ix, reporting false when data is
// not in the form SaveReport writes (ix is then partly written: the
// caller decodes data again with encoding/json).
func decodeIndex(data []byte, ix *index, in *interner) bool {
	d := decoder{data: data, in: in}
	ok := d.object(func(key []byte) bool {
		switch string(key) {
		case "Provider":
			return d.str(&ix.Provider, true)
		case "Region":
			return d.str(&ix.Region, true)
		case "Zone":
			return d.str(&ix.Zone, true)
		case "Hostname":
			return d.str(&ix.Hostname, false)
		case "Accelerator":
			return d.str(&ix.Accelerator, true)
		case "GPUName":
			return d.str(&ix.GPUName, true)
		case "GPUCount":
			return d.int(&ix.GPUCount)
		case "GPUMemoryMiB":
			return d.uint64(&ix.GPUMemoryMiB)
		case "StorageClass":
			return d.str(&ix.StorageClass, true)
		case "StorageFreeGB":
			return d.float(&ix.StorageFreeGB)
		case "StorageReadMBps":
			return d.float(&ix.StorageReadMBps)
		case "BandwidthGbps":
			return d.float(&ix.BandwidthGbps)
		case "PricePerHour":
			return d.float(&ix.PricePerHour)
		case "Runtime":
			return d.runtime(&ix.Runtime)
		case "RuntimeFingerprint":
			return d.str(&ix.RuntimeFingerprint, true)
		case "Simulated":
			return d.bool(&ix.Simulated)
		case "Profile":
			return d.str(&ix.Profile, true)
		case "Passed":
			return d.bool(&ix.Passed)
		case "FailedChecks":
			return d.strings(&ix.FailedChecks)
		case "GresGPUs":
			g := new(int)
			ix.GresGPUs = g
			return d.int(g)
		case "GeneratedAt":
			var s string
			return d.str(&s, true) && s == zeroTime
		case "generated_at_ns":
			n, ok := d.integer(64)
			ix.GeneratedAtNS = n
			return ok
		}
		return false
	})
	d.space()
	return ok && d.i == len(d.data)
}

type decoder struct {
	data []byte
	i    int
	in   *interner
}

func (d *decoder) space() {
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// next skips space and consumes c.
func (d *decoder) next(c byte) bool {
	d.space()
	if d.i < len(d.data) && d.data[d.i] == c {
		d.i++
		return true
	}
	return false
}

// object reads {"key": value, …}, calling field for each key with the
// decoder at its value.
func (d *decoder) object(field func(key []byte) bool) bool {
	if !d.next('{') {
		return false
	}
	if d.next('}') {
		return true
	}
	for {
		key, ok := d.raw()
		if !ok || !d.next(':') {
			return false
		}
		d.space()
		if !field(key) {
			return false
		}
		if d.next('}') {
			return true
		}
		if !d.next(',') {
			return false
		}
	}
}

// raw reads a string without escapes and returns its bytes (valid
// UTF-8, no control characters), or false.
func (d *decoder) raw() ([]byte, bool) {
	if !d.next('"') {
		return nil, false
	}
	start, ascii := d.i, true
	for ; d.i < len(d.data); d.i++ {
		switch c := d.data[d.i]; {
		case c == '"':
			b := d.data[start:d.i]
			d.i++
			return b, ascii || utf8.Valid(b)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

// str reads a string into v, shared with equal ones when share is set.
// A string with escapes is rare (a quote in a failed check's message):
// encoding/json unquotes it, exactly as it would have.
func (d *decoder) str(v *string, share bool) bool {
	start := d.i
	b, ok := d.raw()
	if ok {
		if share {
			*v = d.in.bytes(b)
		} else {
			*v = string(b)
		}
		return true
	}
	d.i = start
	end, ok := d.skipString()
	if !ok {
		return false
	}
	return json.Unmarshal(d.data[start:end], v) == nil
}

// skipString moves past a string that may hold escapes and returns
// where it ends.
func (d *decoder) skipString() (int, bool) {
	if !d.next('"') {
		return 0, false
	}
	for ; d.i < len(d.data); d.i++ {
		switch d.data[d.i] {
		case '\\':
			d.i++
		case '"':
			d.i++
			return d.i, true
		}
	}
	return 0, false
}

func (d *decoder) strings(v *[]string) bool {
	if !d.next('[') {
		return false
	}
	out := []string{} // [] decodes to an empty slice, not nil
	if d.next(']') {
		*v = out
		return true
	}
	for {
		var s string
		d.space()
		if !d.str(&s, false) {
			return false
		}
		out = append(out, s)
		if d.next(']') {
			*v = out
			return true
		}
		if !d.next(',') {
			return false
		}
	}
}

func (d *decoder) bool(v *bool) bool {
	for _, lit := range [...]string{"true", "false"} {
		if len(d.data)-d.i >= len(lit) && string(d.data[d.i:d.i+len(lit)]) == lit {
			d.i += len(lit)
			*v = lit == "true"
			return true
		}
	}
	return false
}

// number reads a JSON number literal; integral says it has no fraction
// or exponent.
func (d *decoder) number() (lit []byte, integral, ok bool) {
	start := d.i
	digits := func() int {
		n := 0
		for d.i < len(d.data) && d.data[d.i] >= '0' && d.data[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.i < len(d.data) && d.data[d.i] == '-' {
		d.i++
	}
	intStart := d.i
	if n := digits(); n == 0 || (n > 1 && d.data[intStart] == '0') {
		return nil, false, false
	}
	integral = true
	if d.i < len(d.data) && d.data[d.i] == '.' {
		d.i++
		if digits() == 0 {
			return nil, false, false
		}
		integral = false
	}
	if d.i < len(d.data) && (d.data[d.i] == 'e' || d.data[d.i] == 'E') {
		d.i++
		if d.i < len(d.data) && (d.data[d.i] == '+' || d.data[d.i] == '-') {
			d.i++
		}
		if digits() == 0 {
			return nil, false, false
		}
		integral = false
	}
	return d.data[start:d.i], integral, true
}

// The conversions are encoding/json's: an integer field takes only an
// integer literal in range, a float any literal in range.

func (d *decoder) integer(bits int) (int64, bool) {
	lit, integral, ok := d.number()
	if !ok || !integral {
		return 0, false
	}
	n, err := strconv.ParseInt(string(lit), 10, bits)
	return n, err == nil
}

func (d *decoder) int(v *int) bool {
	n, ok := d.integer(strconv.IntSize)
	*v = int(n)
	return ok
}

func (d *decoder) uint64(v *uint64) bool {
	lit, integral, ok := d.number()
	if !ok || !integral {
		return false
	}
	n, err := strconv.ParseUint(string(lit), 10, 64)
	*v = n
	return err == nil
}

func (d *decoder) float(v *float64) bool {
	lit, _, ok := d.number()
	if !ok {
		return false
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	*v = f
	return err == nil
}

func (d *decoder) runtime(rt *storedRuntime) bool {
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "NvidiaDriver":
			return d.str(&rt.NvidiaDriver, true)
		case "CUDADriverAPI":
			return d.str(&rt.CUDADriverAPI, true)
		case "CUDA":
			return d.str(&rt.CUDA, true)
		case "Python":
			return d.str(&rt.Python, true)
		case "PyTorch":
			return d.str(&rt.PyTorch, true)
		case "TorchCUDA":
			return d.str(&rt.TorchCUDA, true)
		case "CuDNN":
			return d.str(&rt.CuDNN, true)
		case "FIPSEnabled":
			return d.bool(&rt.FIPSEnabled)
		}
		return false
	})
}
