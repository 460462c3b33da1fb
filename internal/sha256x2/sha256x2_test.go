package sha256x2

import (
	"crypto/sha256"
	"hash"
	"math/rand/v2"
	"sync"
	"testing"
)

// check feeds the same pieces to Write2 and to two plain hashes.
func check(t *testing.T, prefixA, prefixB int, pieces [][2][]byte) {
	t.Helper()
	ha, hb := sha256.New(), sha256.New()
	wa, wb := sha256.New(), sha256.New()
	pre := make([]byte, max(prefixA, prefixB))
	for i := range pre {
		pre[i] = byte(i * 7)
	}
	ha.Write(pre[:prefixA])
	wa.Write(pre[:prefixA])
	hb.Write(pre[:prefixB])
	wb.Write(pre[:prefixB])
	for _, p := range pieces {
		Write2(ha, hb, p[0], p[1])
		wa.Write(p[0])
		wb.Write(p[1])
	}
	if string(ha.Sum(nil)) != string(wa.Sum(nil)) || string(hb.Sum(nil)) != string(wb.Sum(nil)) {
		t.Fatalf("prefixes %d/%d, pieces %d: digests differ from crypto/sha256", prefixA, prefixB, len(pieces))
	}
}

func random(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestWrite2Alignments covers every pair of starting offsets within a
// block, with lengths around the pairing threshold and block edges, and
// the same slice given for both streams (how the wheel verifier calls it).
func TestWrite2Alignments(t *testing.T) {
	if !Available {
		t.Log("no SHA-NI here: this checks the fallback only")
	}
	r := rand.New(rand.NewPCG(1, 2))
	lens := []int{0, 1, 63, 64, 65, minPair - 1, minPair, minPair + 1, 1000, 4096 + 17}
	for a := range 64 {
		for b := range 64 {
			for _, n := range lens {
				p := random(r, n)
				check(t, a, b, [][2][]byte{{p, p}})
				q := random(r, n+int(r.IntN(200)))
				check(t, a, b+64, [][2][]byte{{p, q}, {q, p}})
			}
		}
	}
}

// TestWrite2Stream hashes long streams cut at random points, as a
// network read cuts them.
func TestWrite2Stream(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	data := random(r, 3<<20)
	for range 50 {
		var pieces [][2][]byte
		for off := 0; off < len(data); {
			n := min(len(data)-off, 1+int(r.IntN(300000)))
			shift := int(r.IntN(64))
			pb := data[off:min(len(data), off+n+shift)]
			pieces = append(pieces, [2][]byte{data[off : off+n], pb})
			off += n
		}
		check(t, int(r.IntN(200)), int(r.IntN(200)), pieces)
	}
}

// TestWrite2Kernel calls the kernel directly on lengths that are not a
// whole number of blocks: it must take only the whole blocks and leave
// both the bytes after them and the second state's input alone.
func TestWrite2Kernel(t *testing.T) {
	if !Available {
		t.Skip("no SHA-NI on this CPU: the kernel cannot run (the fallback is covered by the other tests)")
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{64, 127, 128, 64*33 + 5} {
		p1, p2 := random(r, n), random(r, n+100)
		ha, hb := sha256.New(), sha256.New()
		var sa, sb [stateSize]byte
		state(ha, &sa)
		state(hb, &sb)
		var da, db [8]uint32
		getH(&sa, &da)
		getH(&sb, &db)
		blocks := n &^ 63
		blockPair(&da, &db, p1, p2)
		setState(ha, &sa, &da, uint64(blocks))
		setState(hb, &sb, &db, uint64(blocks))
		if got, want := ha.Sum(nil), sha256.Sum256(p1[:blocks]); string(got) != string(want[:]) {
			t.Fatalf("n=%d: stream 1 wrong", n)
		}
		if got, want := hb.Sum(nil), sha256.Sum256(p2[:blocks]); string(got) != string(want[:]) {
			t.Fatalf("n=%d: stream 2 wrong", n)
		}
	}
}

func TestWrite2Fallback(t *testing.T) {
	was := Available
	Available = false
	defer func() { Available = was }()
	r := rand.New(rand.NewPCG(7, 8))
	p := random(r, 10000)
	check(t, 3, 5, [][2][]byte{{p, p[1:]}})
}

func TestWrite2RefusesOtherHashes(t *testing.T) {
	if !Available {
		t.Skip("no SHA-NI on this CPU: Write2 falls back to plain writes and checks nothing")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Write2 took a hash that is not crypto/sha256's")
		}
	}()
	p := make([]byte, 4096)
	Write2(sha256.New224(), sha256.New(), p, p)
}

func FuzzWrite2(f *testing.F) {
	f.Add(uint8(0), uint8(0), []byte("abc"), uint16(0))
	f.Fuzz(func(t *testing.T, pa, pb uint8, data []byte, split uint16) {
		data = append(data, make([]byte, 300)...)
		s := int(split) % len(data)
		check(t, int(pa), int(pb), [][2][]byte{{data[:s], data[s:]}, {data[s:], data}})
	})
}

var bench1, bench2 = make([]byte, 1<<20), make([]byte, 1<<20)

func benchHashes(b *testing.B, write func(ha, hb hash.Hash)) {
	b.SetBytes(2 << 20)
	ha, hb := sha256.New(), sha256.New()
	for b.Loop() {
		write(ha, hb)
	}
}

// BenchmarkWrite2 against the same two hashes one after the other (what
// one core does without the kernel) and in two goroutines (two cores).
func BenchmarkWrite2(b *testing.B) {
	b.Run("interleaved", func(b *testing.B) {
		benchHashes(b, func(ha, hb hash.Hash) { Write2(ha, hb, bench1, bench2) })
	})
	b.Run("serial", func(b *testing.B) {
		benchHashes(b, func(ha, hb hash.Hash) { ha.Write(bench1); hb.Write(bench2) })
	})
	b.Run("two-goroutines", func(b *testing.B) {
		benchHashes(b, func(ha, hb hash.Hash) {
			var wg sync.WaitGroup
			wg.Go(func() { ha.Write(bench1) })
			hb.Write(bench2)
			wg.Wait()
		})
	})
}
