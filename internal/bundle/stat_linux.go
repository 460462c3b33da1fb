package bundle

import (
	"math"
	"os"
	"syscall"

	"github.com/gpupass/gpupass/internal/probe"
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

// freeSpace is what an unprivileged writer may still write to the
// filesystem holding dir.
func freeSpace(dir string) (int64, bool) {
	free, _, err := probe.FreeBytes(dir)
	return int64(min(free, math.MaxInt64)), err == nil
}
