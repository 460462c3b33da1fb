//go:build !linux && !darwin

package localstack

import "os"

// tryLock: no flock here; the state dir is not guarded.
func tryLock(*os.File) (bool, error) { return true, nil }

func unlock(*os.File) {}
