package probe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Storage probes the filesystem holding Path: type, mount options (from
// /proc/self/mountinfo) and free space (statfs).
type Storage struct {
	Path string
	// MountInfo defaults to /proc/self/mountinfo; tests point it at
	// testdata.
	MountInfo string
}

// Name implements Probe.
func (Storage) Name() string { return "storage" }

// Measure implements Probe.
func (p Storage) Measure(ctx context.Context) (Section, error) {
	s := StorageSection{Path: p.Path}
	abs, err := filepath.Abs(p.Path)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		s.Reason = fmt.Sprintf("storage path %s: %v", p.Path, err)
		return s, ctx.Err()
	}
	s.FreeBytes, s.TotalBytes, err = FreeBytes(abs)
	if err != nil {
		s.Reason = err.Error()
		return s, ctx.Err()
	}
	mi := p.MountInfo
	if mi == "" {
		mi = "/proc/self/mountinfo"
	}
	m, err := FindMount(mi, abs)
	if err != nil {
		s.Reason = err.Error()
		return s, ctx.Err()
	}
	s.MountPoint, s.Source, s.FSType, s.MountOptions = m.MountPoint, m.Source, m.FSType, m.Options
	return s, ctx.Err()
}

// FreeBytes is what an unprivileged writer may still write to the
// filesystem holding path, and its size.
func FreeBytes(path string) (free, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	MountPoint string
	Source     string
	FSType     string
	// Options merges the per-mount options (where noatime lives) and
	// the superblock options, per-mount first, without duplicates.
	Options []string
}

// FindMount returns the mount that holds path: the longest mount point
// that is a prefix of it, the last such line winning (a later mount on
// the same point hides the earlier one).
func FindMount(mountinfo, path string) (Mount, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return Mount{}, fmt.Errorf("reading mount table: %w", err)
	}
	defer f.Close()
	var best Mount
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		m, err := parseMountLine(sc.Text())
		if err != nil {
			return Mount{}, fmt.Errorf("%s:%d: %w", mountinfo, n, err)
		}
		if !under(path, m.MountPoint) {
			continue
		}
		if !found || len(m.MountPoint) >= len(best.MountPoint) {
			best, found = m, true
		}
	}
	if err := sc.Err(); err != nil {
		return Mount{}, fmt.Errorf("reading %s: %w", mountinfo, err)
	}
	if !found {
		return Mount{}, fmt.Errorf("%s: no mount holds %s", mountinfo, path)
	}
	return best, nil
}

func under(path, mp string) bool {
	if mp == "/" {
		return strings.HasPrefix(path, "/")
	}
	return path == mp || strings.HasPrefix(path, mp+"/")
}

// parseMountLine parses "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 -
// ext3 /dev/root rw,errors=continue" (proc(5)).
func parseMountLine(line string) (Mount, error) {
	fields := strings.Fields(line)
	sep := -1
	for i, f := range fields {
		if f == "-" && i >= 6 {
			sep = i
			break
		}
	}
	if sep < 0 || len(fields) < sep+3 {
		return Mount{}, fmt.Errorf("malformed mountinfo line %q", line)
	}
	m := Mount{
		MountPoint: unescapeOctal(fields[4]),
		FSType:     fields[sep+1],
		Source:     unescapeOctal(fields[sep+2]),
	}
	seen := map[string]bool{}
	add := func(opts string) {
		for _, o := range strings.Split(opts, ",") {
			if o != "" && !seen[o] {
				seen[o] = true
				m.Options = append(m.Options, o)
			}
		}
	}
	add(fields[5])
	if len(fields) > sep+3 {
		add(fields[sep+3])
	}
	return m, nil
}

// unescapeOctal undoes the kernel's \040-style escaping of spaces, tabs,
// newlines and backslashes in mount paths.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ReadThroughput measures sequential read throughput on Path: it writes a
// file of Bytes, syncs it, asks the kernel to drop it from the page cache
// (posix_fadvise DONTNEED) and reads it back in 1 MiB blocks. The file is
// removed afterwards. It is short by design (default 64 MiB): a health
// signal, not a benchmark.
type ReadThroughput struct {
	Path  string
	Bytes int64
	// MaxAge bounds how long a measurement is reused while the mount
	// stays the same (default 1 h): throughput is not a fixed property,
	// but it does not change between two suite runs a minute apart.
	MaxAge time.Duration
	// MountInfo is as in Storage.
	MountInfo string
}

// ReadSection is the result of ReadThroughput.
type ReadSection struct {
	MBps       float64   `json:"mbps"`
	Bytes      int64     `json:"bytes"`
	Note       string    `json:"note,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	MeasuredAt time.Time `json:"measured_at"`
}

func (s ReadSection) apply(f *Facts) {
	f.Storage.ReadMBps, f.Storage.ReadNote = s.MBps, s.Note
	if s.Reason != "" {
		f.Storage.ReadNote = s.Reason
	}
}

// Name implements Probe.
func (ReadThroughput) Name() string { return "storage.read" }

// Measure implements Probe.
func (p ReadThroughput) Measure(ctx context.Context) (Section, error) {
	n := p.Bytes
	if n <= 0 {
		n = 64 << 20
	}
	s := ReadSection{Bytes: n, MeasuredAt: time.Now()}
	f, err := os.CreateTemp(p.Path, ".gpupass-readprobe-*")
	if err != nil {
		s.Reason = fmt.Sprintf("read probe: %v", err)
		return s, ctx.Err()
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		// Not zeros: some filesystems compress or dedupe them.
		buf[i] = byte(i*7 + i>>8)
	}
	for w := int64(0); w < n; w += int64(len(buf)) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if _, err := f.Write(buf[:min(int64(len(buf)), n-w)]); err != nil {
			s.Reason = fmt.Sprintf("read probe: writing test file: %v", err)
			return s, nil
		}
	}
	if err := f.Sync(); err != nil {
		s.Reason = fmt.Sprintf("read probe: %v", err)
		return s, nil
	}
	s.Note = "sequential read after fsync and fadvise(DONTNEED)"
	if err := dropPageCache(f); err != nil {
		s.Note = "sequential read; page cache could not be dropped (" + err.Error() + "), figure may be memory speed"
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		s.Reason = fmt.Sprintf("read probe: %v", err)
		return s, nil
	}
	start := time.Now()
	var read int64
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		k, err := f.Read(buf)
		read += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			s.Reason = fmt.Sprintf("read probe: reading test file: %v", err)
			return s, nil
		}
	}
	el := time.Since(start).Seconds()
	if read != n || el <= 0 {
		s.Reason = fmt.Sprintf("read probe: read %d of %d bytes", read, n)
		return s, nil
	}
	s.MBps = float64(read) / 1e6 / el
	return s, nil
}

// StateKey implements Keyed: the same mount (device, type, options) and
// a measurement younger than MaxAge.
func (p ReadThroughput) StateKey(_ context.Context, prev Section) (string, bool) {
	rs, ok := prev.(ReadSection)
	maxAge := p.MaxAge
	if maxAge == 0 {
		maxAge = time.Hour
	}
	if !ok || rs.Reason != "" || time.Since(rs.MeasuredAt) > maxAge {
		return "", false
	}
	abs, err := filepath.Abs(p.Path)
	if err != nil {
		return "", false
	}
	mi := p.MountInfo
	if mi == "" {
		mi = "/proc/self/mountinfo"
	}
	m, err := FindMount(mi, abs)
	if err != nil {
		return "", false
	}
	return fmt.Sprintf("%s|%s|%s|%s|%d", m.MountPoint, m.Source, m.FSType, strings.Join(m.Options, ","), p.Bytes), true
}
