package api_test

import (
	"bytes"
	"testing"

	"github.com/gpupass/gpupass/internal/api"
)

func TestCheckpointChunksRoundTrip(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("0123456789abcdef"), api.CheckpointChunk/16*2+7) // three chunks
	small := []byte("step 20")
	chunks := func(name string, b []byte) [][]byte { return api.CheckpointChunks(name, b) }
	bigC, smallC := chunks("ckpt-40.pt", big), chunks("ckpt-20.pt", small)
	corrupt := append([][]byte(nil), chunks("ckpt-60.pt", big)...)
	corrupt[1] = append([]byte(nil), corrupt[1]...)
	corrupt[1][len(corrupt[1])-1] ^= 1
	tests := []struct {
		name     string
		records  [][]byte
		wantName string
		wantData []byte
	}{
		{"one small", smallC, "ckpt-20.pt", small},
		{"empty file", chunks("ckpt-0.pt", nil), "ckpt-0.pt", []byte{}},
		{"newest wins", append(append([][]byte{}, smallC...), bigC...), "ckpt-40.pt", big},
		{"cut short keeps the older", append(append([][]byte{}, smallC...), bigC[:2]...), "ckpt-20.pt", small},
		{"cut short, then a whole one", append(append(append([][]byte{}, bigC[:1]...), smallC...), bigC...), "ckpt-40.pt", big},
		{"digest mismatch keeps the older", append(append([][]byte{}, smallC...), corrupt...), "ckpt-20.pt", small},
		{"none", nil, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var a api.CheckpointAssembler
			for i, r := range tt.records {
				if err := a.Add(r); err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
			}
			name, data := a.Newest()
			if name != tt.wantName || !bytes.Equal(data, tt.wantData) || (tt.wantData != nil && data == nil) {
				t.Errorf("newest = %q (%d bytes), want %q (%d bytes)", name, len(data), tt.wantName, len(tt.wantData))
			}
		})
	}
}

func TestCheckpointBadRecords(t *testing.T) {
	t.Parallel()
	for _, rec := range []string{"no header", `{"name":"../x","size":1,"sha256":"","offset":0}` + "\nx", `{"name":"a","size":-1}` + "\n", "{bad json\n"} {
		var a api.CheckpointAssembler
		if err := a.Add([]byte(rec)); err == nil {
			t.Errorf("record %q accepted", rec)
		}
	}
}
