package train

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSplitCommand(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "python3 train.py --steps 20", want: []string{"python3", "train.py", "--steps", "20"}},
		{in: `  python3  'my script.py' "a \"b\" $HOME"  `, want: []string{"python3", "my script.py", `a "b" $HOME`}},
		{in: `torchrun --nproc-per-node=8 train.py\ x ''`, want: []string{"torchrun", "--nproc-per-node=8", "train.py x", ""}},
		{in: `["python3", "train.py", "a b"]`, want: []string{"python3", "train.py", "a b"}},
		{in: "echo $(rm -rf /) ; ls", want: []string{"echo", "$(rm", "-rf", "/)", ";", "ls"}},
		{in: "", wantErr: true},
		{in: `"open`, wantErr: true},
		{in: `trailing\`, wantErr: true},
		{in: `[]`, wantErr: true},
		{in: `["a", 1]`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := SplitCommand(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("words (-want +got):\n%s", diff)
			}
		})
	}
}
