// Package bytesize writes byte counts the one way gpupass prints them
// (bundle progress, train's work dir summary). It imports nothing but fmt,
// so any command may use it without linking what its callers link.
package bytesize

import "fmt"

// Format writes n as B, KiB, MiB or GiB with one decimal.
func Format(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
