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

// freeSpace is what an unprivileged writer may still write to the
// filesystem holding dir.
func freeSpace(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * st.Bsize, true
}
