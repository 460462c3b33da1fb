//go:build amd64

package sha256pair

import (
	"crypto/rand"
	"crypto/sha256"
	"sync"
	"testing"
)

func TestSum2(t *testing.T) {
	for n := 0; n < 1000; n += 7 {
		a, b := make([]byte, n), make([]byte, n)
		rand.Read(a)
		rand.Read(b)
		s1, s2 := Sum2(a, b)
		if s1 != sha256.Sum256(a) || s2 != sha256.Sum256(b) {
			t.Fatalf("n=%d mismatch", n)
		}
	}
}

var bufA, bufB = make([]byte, 1<<20), make([]byte, 1<<20)

func BenchmarkPair(b *testing.B) {
	b.SetBytes(2 << 20)
	d1, d2 := iv, iv
	for i := 0; i < b.N; i++ {
		blockPair(&d1, &d2, bufA, bufB)
	}
}

func BenchmarkTwoSerial(b *testing.B) {
	b.SetBytes(2 << 20)
	h1, h2 := sha256.New(), sha256.New()
	for i := 0; i < b.N; i++ {
		h1.Write(bufA)
		h2.Write(bufB)
	}
}

func BenchmarkTwoGoroutines(b *testing.B) {
	b.SetBytes(2 << 20)
	h1, h2 := sha256.New(), sha256.New()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { h1.Write(bufA); wg.Done() }()
		h2.Write(bufB)
		wg.Wait()
	}
}
