package spec

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "2.1.0+cu121", want: "2.1.0+cu121"},
		{in: "2.1.0+CU121", want: "2.1.0+cu121"},
		{in: "v1.0", want: "1.0"},
		{in: "1.0-alpha.1", want: "1.0a1"},
		{in: "1.0.0RC2", want: "1.0.0rc2"},
		{in: "1.0-1", want: "1.0.post1"},
		{in: "1.0.post", want: "1.0.post0"},
		{in: "1.0_dev3", want: "1.0.dev3"},
		{in: "1!2.0", want: "1!2.0"},
		{in: "0.0.23.post1", want: "0.0.23.post1"},
		{in: "2.1.0+local_tag-x", want: "2.1.0+local.tag.x"},
		{in: "01.002.0003", want: "1.2.3"},
		{in: "latest", wantErr: true},
		{in: "1.0+", wantErr: true},
		{in: "", wantErr: true},
		{in: "99999999999999999999999.0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			v, err := ParseVersion(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseVersion(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if err == nil && v.String() != tt.want {
				t.Errorf("ParseVersion(%q) = %q, want %q", tt.in, v.String(), tt.want)
			}
		})
	}
}

func TestVersionCompare(t *testing.T) {
	t.Parallel()
	// Each version sorts strictly before the next (PEP 440 ordering).
	order := []string{"1.0.dev1", "1.0a1", "1.0a2.dev1", "1.0a2", "1.0b1", "1.0rc1", "1.0", "1.0.post1", "1.1", "2.0", "1!0.5"}
	for i := 0; i+1 < len(order); i++ {
		a, b := mustVersion(order[i]), mustVersion(order[i+1])
		if a.Compare(b) >= 0 || b.Compare(a) <= 0 {
			t.Errorf("%s should sort before %s", order[i], order[i+1])
		}
	}
	if mustVersion("2.1").Compare(mustVersion("2.1.0")) != 0 {
		t.Error("2.1 and 2.1.0 should be equal")
	}
	if mustVersion("2.1.0+cu118").Compare(mustVersion("2.1.0+cu121")) != 0 {
		t.Error("local labels should not affect Compare")
	}
}

func TestParseRequirement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in        string
		canonical string
		pinned    string
		wantErr   bool
	}{
		{in: "transformers==4.38.2", canonical: "transformers==4.38.2", pinned: "4.38.2"},
		{in: "Flash_Attn == 2.5.5", canonical: "flash-attn==2.5.5", pinned: "2.5.5"},
		{in: "transformers[Torch,sentencepiece]==4.38.2", canonical: "transformers[sentencepiece,torch]==4.38.2", pinned: "4.38.2"},
		{in: "numpy (==1.26.4)", canonical: "numpy==1.26.4", pinned: "1.26.4"},
		{in: `scipy==1.12.0 ;  python_version >= "3.9"`, canonical: `scipy==1.12.0; python_version >= "3.9"`, pinned: "1.12.0"},
		{in: `triton==2.1.0;sys_platform=='linux'and(platform_machine=="x86_64")`, canonical: `triton==2.1.0; sys_platform == "linux" and (platform_machine == "x86_64")`, pinned: "2.1.0"},
		{in: "requests", canonical: "requests"},
		{in: "numpy>=1.0,<2", canonical: "numpy<2,>=1.0"},
		{in: "numpy==1.*", canonical: "numpy==1.*"},
		{in: "peft @ file:///w/peft.whl", canonical: "peft @ file:///w/peft.whl"},
		{in: "torch==2.1.0+CU121", canonical: "torch==2.1.0+cu121", pinned: "2.1.0+cu121"},
		{in: "transformers==", wantErr: true},
		{in: "!!bad==1.0", wantErr: true},
		{in: "numpy==one", wantErr: true},
		{in: "numpy[==1", wantErr: true},
		{in: "numpy; ", wantErr: true},
		{in: `numpy==1.26.4; python_version = "3.9"`, wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			r, err := ParseRequirement(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseRequirement(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			pinned := ""
			if v, ok := r.Pinned(); ok {
				pinned = v.String()
			}
			if diff := cmp.Diff([]string{tt.canonical, tt.pinned}, []string{r.Canonical, pinned}); diff != "" {
				t.Errorf("canonical, pinned (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNormalizeName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Flash_Attn": "flash-attn", "flash.attn": "flash-attn", "FLASH--attn": "flash-attn", "numpy": "numpy",
	} {
		if got := NormalizeName(in); got != want {
			t.Errorf("NormalizeName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{in: "2GB", want: 2_000_000_000},
		{in: "2 GB", want: 2_000_000_000},
		{in: "512MiB", want: 512 << 20},
		{in: "1.5GiB", want: 3 << 29},
		{in: "1073741824", want: 1 << 30},
		{in: "2gib", want: 2 << 30},
		{in: "0", wantErr: true},
		{in: "-2GB", wantErr: true},
		{in: "2G", wantErr: true},
		{in: "lots", wantErr: true},
		{in: "99999999TB", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseSize(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("ParseSize(%q) = %d, %v; want %d, err %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseOCIRef(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + "ab12" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789ab"
	tests := []struct {
		in      string
		want    OCIRef
		wantErr bool
	}{
		{in: "127.0.0.1:5000/team/wheels:v1", want: OCIRef{Name: "127.0.0.1:5000/team/wheels", Tag: "v1"}},
		{in: "localhost:5000/wheels@" + digest, want: OCIRef{Name: "localhost:5000/wheels", Digest: digest}},
		{in: "reg.example/a/b:v1@" + digest, want: OCIRef{Name: "reg.example/a/b", Tag: "v1", Digest: digest}},
		{in: "[::1]:5000/w:t", want: OCIRef{Name: "[::1]:5000/w", Tag: "t"}},
		{in: "team/wheels", wantErr: true},
		{in: "Team/Wheels:v1", wantErr: true},
		{in: "https://reg.example/w:v1", wantErr: true},
		{in: "reg.example/w@sha256:abc", wantErr: true},
		{in: "reg.example/w:", wantErr: true},
		{in: "", wantErr: true},
		// A tag has at most 128 characters; digests are lowercase hex of
		// their algorithm's length.
		{in: "reg.example/w:" + strings.Repeat("t", 128), want: OCIRef{Name: "reg.example/w", Tag: strings.Repeat("t", 128)}},
		{in: "reg.example/w:" + strings.Repeat("t", 129), wantErr: true},
		{in: "reg.example/w@sha512:" + strings.Repeat("0a", 64), want: OCIRef{Name: "reg.example/w", Digest: "sha512:" + strings.Repeat("0a", 64)}},
		{in: "reg.example/w@sha512:" + strings.Repeat("0a", 32), wantErr: true},
		{in: "reg.example/w@sha256:" + strings.Repeat("0A", 32), wantErr: true},
		{in: "reg.example/w@sha256:" + strings.Repeat("0a", 33), wantErr: true},
		{in: "reg.example/w@md5:" + strings.Repeat("0a", 32), wantErr: true},
	}
	for _, tt := range tests {
		name := tt.in
		if len(name) > 60 {
			name = name[:60] + "…"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseOCIRef(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseOCIRef(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestSuggest(t *testing.T) {
	t.Parallel()
	keys := []string{"cuda", "nvidia-driver", "python", "pytorch", "cuda-malloc-async", "packages"}
	tests := []struct {
		in   string
		want []string
	}{
		{"cuda_malloc_async", []string{"cuda-malloc-async"}},
		{"pytorh", []string{"pytorch"}},
		{"Python", []string{"python"}},
		{"nvidia_driver", []string{"nvidia-driver"}},
		{"zzzzzz", nil},
		{"h100", []string{"h100-pcie", "h100-sxm5", "h100-nvl"}},
	}
	for _, tt := range tests {
		names := keys
		if tt.in == "h100" {
			names = tbl().acceleratorNames()
		}
		if diff := cmp.Diff(tt.want, suggest(tt.in, names)); diff != "" {
			t.Errorf("suggest(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}
