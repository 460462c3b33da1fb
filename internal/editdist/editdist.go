// Package editdist holds the one edit distance behind every "did you
// mean" gpupass prints (spec keys, GPUPASS_* variables). Pure: no I/O.
package editdist

// Max is what Distance answers for inputs too long to compare (names and
// keys are short; anything longer is no near miss).
const Max = 1 << 30

// Distance is the edit distance of a and b (bytes) where an insertion, a
// deletion, a substitution or a swap of two adjacent bytes is one edit
// (optimal string alignment): SPCE is one edit from SPEC, as a typist
// sees it, not two. Max when either is longer than 64 bytes.
func Distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return Max
	}
	prev2 := make([]int, len(b)+1) // row i-2, for swaps
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+c)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
