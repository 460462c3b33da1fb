package bundle

import (
	"os"
	"syscall"
)

func statOf(fi os.FileInfo) (fileStat, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileStat{}, false
	}
	return fileStat{
		Size: fi.Size(), Mtime: fi.ModTime().UnixNano(),
		Ctime: st.Ctim.Nano(), Ino: st.Ino, Dev: uint64(st.Dev),
	}, true
}

// preallocate reserves size bytes for f; a filesystem that cannot is
// simply written to as usual.
func preallocate(f *os.File, size int64) {
	if size > 0 {
		_ = syscall.Fallocate(int(f.Fd()), 0, 0, size)
	}
}
