package wheel

import (
	"archive/zip"
	"crypto/sha512"
)

func checkEntryLong(zf *zip.File, e recordEntry) error {
	if e.algo == "sha384" {
		return hashEntry(zf, e, sha512.New384())
	}
	return hashEntry(zf, e, sha512.New())
}
