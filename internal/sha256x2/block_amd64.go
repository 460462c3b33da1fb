//go:build amd64 && !purego

package sha256x2

import "golang.org/x/sys/cpu"

//go:generate python3 gen.py

// blockPair compresses the first len(p1) bytes, rounded down to 64, of p1
// into dig1 and as many of p2 into dig2; p2 must be at least as long. It
// needs SHA-NI, AVX and SSE4.1 (available says whether they are there).
//
//go:noescape
func blockPair(dig1, dig2 *[8]uint32, p1, p2 []byte)

// cpuid executes CPUID with EAX=leaf, ECX=sub.
func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)

// available checks what crypto/sha256 checks before its own SHA-NI
// kernel: SHA (CPUID leaf 7, EBX bit 29), AVX (with OS support for the
// registers), SSE4.1 and SSSE3.
func available() bool {
	if !cpu.X86.HasAVX || !cpu.X86.HasSSE41 || !cpu.X86.HasSSSE3 {
		return false
	}
	if max, _, _, _ := cpuid(0, 0); max < 7 {
		return false
	}
	_, ebx, _, _ := cpuid(7, 0)
	return ebx&(1<<29) != 0
}
