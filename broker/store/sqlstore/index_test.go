package sqlstore

import (
	"encoding/json"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/storetest"
	"github.com/gpupass/gpupass/internal/conformance"
)

// stored is what SaveReport writes for idx.
func stored(t testing.TB, idx store.NodeIndex) []byte {
	t.Helper()
	b, err := json.Marshal(storedIndex(idx))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// jsonIndex is the reference: how every index was read before decodeIndex.
func jsonIndex(data []byte) (store.NodeIndex, error) {
	var ix index
	if err := json.Unmarshal(data, &ix); err != nil {
		return store.NodeIndex{}, err
	}
	return ix.nodeIndex(), nil
}

// Every index SaveReport writes is read by the fast path (no fallback to
// encoding/json, which would be correct but slow) into exactly the index
// that was saved.
func TestDecodeIndexReadsWhatSaveReportWrites(t *testing.T) {
	t.Parallel()
	in := newInterner()
	for i := 0; i < 500; i++ {
		_, r, _, ok := storetest.RegistryNode(i)
		if !ok {
			continue
		}
		data := stored(t, r.Index)
		var ix index
		if !decodeIndex(data, &ix, in) {
			// Escaped strings are unquoted by encoding/json, within the
			// fast path: a fallback here means a form it should know.
			t.Fatalf("node %d: the fast path gave up on SaveReport's own form:\n%s", i, data)
		}
		got, err := readIndex(data, in)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(r.Index, got); diff != "" {
			t.Fatalf("node %d: index read back (-saved +read):\n%s\nstored: %s", i, diff, data)
		}
	}
}

// Whatever is stored, readIndex makes of it what encoding/json makes of
// it: the same index, or an error where encoding/json fails.
func TestReadIndexAgreesWithEncodingJSON(t *testing.T) {
	t.Parallel()
	_, r, _, _ := storetest.RegistryNode(2) // GresGPUs set
	base := string(stored(t, r.Index))
	for _, tc := range []struct{ name, data string }{
		{"as saved", base},
		{"spaces", ` { "Provider" : "lambda" , "GPUCount" : 8 , "Runtime" : { "CUDA" : "12.1" } , "FailedChecks" : [ "a" , "b" ] } `},
		{"empty object", `{}`},
		{"older form, no optional fields", `{"Provider":"lambda","GPUCount":8,"Passed":true,"GeneratedAt":"0001-01-01T00:00:00Z","generated_at_ns":5}`},
		{"key in other case", `{"provider":"lambda","gpucount":3}`},
		{"unknown key", `{"Provider":"lambda","Future":{"x":[1,2]}}`},
		{"duplicate key, last wins", `{"Region":"a","Region":"b","GresGPUs":1,"GresGPUs":2}`},
		{"null string", `{"Provider":null}`},
		{"null pointer", `{"GresGPUs":null}`},
		{"null slice", `{"FailedChecks":null}`},
		{"empty slice", `{"FailedChecks":[]}`},
		{"escapes", `{"Hostname":"a\"b\\c\/d\u00e9\ud83d\ude00\n","FailedChecks":["x\ty","\u003cb\u003e"]}`},
		{"lone surrogate", `{"Hostname":"\ud800x"}`},
		{"invalid utf-8", "{\"Hostname\":\"a\xffb\"}"},
		{"control character", "{\"Hostname\":\"a\x01b\"}"},
		{"non-ascii", `{"GPUName":"Grace–Hopper 中"}`},
		{"float in int field", `{"GPUCount":8.0}`},
		{"exponent in int field", `{"GPUCount":1e2}`},
		{"exponent in float field", `{"PricePerHour":2.5e1,"StorageFreeGB":-1E-2}`},
		{"int out of range", `{"GPUCount":99999999999999999999}`},
		{"negative uint", `{"GPUMemoryMiB":-1}`},
		{"big uint", `{"GPUMemoryMiB":18446744073709551615}`},
		{"float out of range", `{"PricePerHour":1e400}`},
		{"leading zero", `{"GPUCount":08}`},
		{"bare minus", `{"GPUCount":-}`},
		{"string for number", `{"GPUCount":"8"}`},
		{"number for string", `{"Provider":8}`},
		{"bool literal cut", `{"Passed":tru}`},
		{"other GeneratedAt", `{"GeneratedAt":"2026-11-29T12:00:00Z","generated_at_ns":7}`},
		{"bad GeneratedAt", `{"GeneratedAt":"yesterday"}`},
		{"trailing data", `{"Provider":"a"}x`},
		{"trailing comma", `{"Provider":"a",}`},
		{"cut short", base[:len(base)/2]},
		{"empty", ``},
		{"array", `[]`},
		{"nested runtime unknown key", `{"Runtime":{"CUDA":"12","ROCm":"6"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want, wantErr := jsonIndex([]byte(tc.data))
			got, err := readIndex([]byte(tc.data), newInterner())
			if (err != nil) != (wantErr != nil) {
				t.Fatalf("readIndex(%s): error %v, encoding/json: %v", tc.data, err, wantErr)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("readIndex(%s) (-encoding/json +readIndex):\n%s", tc.data, diff)
			}
		})
	}
}

// Strings read from many nodes are shared, not copied per node.
func TestDecodeIndexSharesRepeatedStrings(t *testing.T) {
	t.Parallel()
	in := newInterner()
	_, r, _, _ := storetest.RegistryNode(0)
	data := stored(t, r.Index)
	a, err := readIndex(data, in)
	if err != nil {
		t.Fatal(err)
	}
	b, err := readIndex(data, in)
	if err != nil {
		t.Fatal(err)
	}
	if !sameString(a.GPUName, b.GPUName) || !sameString(a.Runtime.CUDA, b.Runtime.CUDA) {
		t.Errorf("GPU name and CUDA version of two reads are copies, want one string shared")
	}
}

// sameString reports whether a and b are one string in memory.
func sameString(a, b string) bool {
	return len(a) > 0 && unsafe.StringData(a) == unsafe.StringData(b)
}

func FuzzReadIndex(f *testing.F) {
	for i := 0; i < 30; i++ {
		if _, r, _, ok := storetest.RegistryNode(i); ok {
			f.Add(stored(f, r.Index))
		}
	}
	f.Add([]byte(`{"GPUCount":1e2,"Hostname":"\ud800"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		want, wantErr := jsonIndex(data)
		got, err := readIndex(data, newInterner())
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("readIndex(%q): error %v, encoding/json: %v", data, err, wantErr)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("readIndex(%q) (-encoding/json +readIndex):\n%s", data, diff)
		}
	})
}

// oldIndex is the index as a broker of the previous release reads and
// writes it, its runtime a struct of its own without JSON tags.
type oldIndex struct {
	store.NodeIndex
	Runtime struct {
		NvidiaDriver, CUDADriverAPI, CUDA, Python, PyTorch, TorchCUDA, CuDNN string
		FIPSEnabled                                                          bool
	}
	GeneratedAtNS int64 `json:"generated_at_ns"`
}

// The index column keeps its form across the change to the report's
// runtime type: a row the previous release wrote loads with its runtime,
// and one this release writes loads in the previous release (brokers of
// both share a database during an upgrade).
func TestIndexRuntimeStoredForm(t *testing.T) {
	t.Parallel()
	// Written by the previous release (its SaveReport's bytes for
	// storetest.RegistryNode(2), cuDNN and FIPS changed to be told apart).
	const old = `{"Provider":"on-prem","Region":"eu-central-1","Zone":"eu-central-1c","Hostname":"gpu-2.eu-central-1.example","Accelerator":"h100-sxm5","GPUName":"NVIDIA H100 80GB HBM3","GPUCount":8,"GPUMemoryMiB":81559,"StorageClass":"","StorageFreeGB":6498.5,"StorageReadMBps":5000.25,"BandwidthGbps":300,"PricePerHour":20.5,"Runtime":{"NvidiaDriver":"535.104.05","CUDADriverAPI":"12.2","CUDA":"12.1.105","Python":"3.10.12","PyTorch":"2.1.0+cu121","TorchCUDA":"12.1","CuDNN":"8.9.2","FIPSEnabled":true},"RuntimeFingerprint":"sha256:ab","Simulated":true,"Profile":"a100","Passed":true,"GresGPUs":2,"GeneratedAt":"0001-01-01T00:00:00Z","generated_at_ns":1795953600002000000}`
	want := conformance.Runtime{NvidiaDriver: "535.104.05", CUDADriverAPI: "12.2", CUDA: "12.1.105", Python: "3.10.12",
		PyTorch: "2.1.0+cu121", TorchCUDA: "12.1", CuDNN: "8.9.2", FIPSEnabled: true}
	var ix index
	if !decodeIndex([]byte(old), &ix, newInterner()) {
		t.Error("the fast path gave up on the previous release's form")
	}
	got, err := readIndex([]byte(old), newInterner())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got.Runtime); diff != "" {
		t.Errorf("runtime of a previous release's row (-want +got):\n%s", diff)
	}
	if ref, err := jsonIndex([]byte(old)); err != nil || !cmp.Equal(want, ref.Runtime) {
		t.Errorf("encoding/json reads the previous release's runtime as %+v (%v)", ref.Runtime, err)
	}

	// Written now, read by the previous release.
	var prev oldIndex
	if err := json.Unmarshal(stored(t, got), &prev); err != nil {
		t.Fatal(err)
	}
	if prev.Runtime.NvidiaDriver != want.NvidiaDriver || prev.Runtime.TorchCUDA != want.TorchCUDA || !prev.Runtime.FIPSEnabled {
		t.Errorf("the previous release reads this release's row's runtime as %+v", prev.Runtime)
	}
	if b := string(stored(t, got)); !strings.Contains(b, `"Runtime":{"NvidiaDriver":"535.104.05","CUDADriverAPI":"12.2","CUDA":"12.1.105","Python":"3.10.12","PyTorch":"2.1.0+cu121","TorchCUDA":"12.1","CuDNN":"8.9.2","FIPSEnabled":true}`) {
		t.Errorf("stored runtime is not in the previous release's form: %s", b)
	}
}
