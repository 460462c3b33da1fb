package train

import "testing"

func TestTrainRunName(t *testing.T) {
	t.Parallel()
	spec := []byte("name: llm-finetune\nruntime: {}\n")
	tests := []struct {
		name string
		flag string
		env  map[string]string
		want string
	}{
		{"spec name outside CI", "", nil, "llm-finetune"},
		{"the given name wins", "bert", nil, "bert"},
		{"GitHub Actions adds the short commit", "", map[string]string{"GITHUB_SHA": "8a3f9b21c0ffee00"}, "llm-finetune-8a3f9b2"},
		{"GitLab's short sha", "bert", map[string]string{"CI_COMMIT_SHORT_SHA": "1234abcd", "GITHUB_SHA": "ffff"}, "bert-1234abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := RunName(tt.flag, spec, func(k string) string { return tt.env[k] }); got != tt.want {
				t.Errorf("RunName = %q, want %q", got, tt.want)
			}
		})
	}
}
