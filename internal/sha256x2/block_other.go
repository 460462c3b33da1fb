//go:build !amd64 || purego

package sha256x2

func available() bool { return false }

func blockPair(dig1, dig2 *[8]uint32, p1, p2 []byte) {
	panic("sha256x2: no interleaved kernel on this platform")
}
