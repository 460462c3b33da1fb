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
