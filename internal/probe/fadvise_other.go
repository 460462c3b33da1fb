//go:build !linux

package probe

import (
	"errors"
	"os"
)

// dropPageCache: only Linux has fadvise; the CLI built for other systems
// (macOS) still compiles, and the read probe says its figure may be
// memory speed.
func dropPageCache(*os.File) error { return errors.ErrUnsupported }
