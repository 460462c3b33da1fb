package flagenv_test

import (
	"testing"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/command/flagenv"
)

// A list flag takes repeats, comma lists and its environment variable
// alike, and the command line wins over the environment.
func TestListVar(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{nil, "", ""},
		{[]string{"--broker-url", "http://a:1"}, "", "http://a:1"},
		{[]string{"--broker-url", "http://a:1", "--broker-url", "http://b:2, http://c:3"}, "", "http://a:1,http://b:2,http://c:3"},
		{nil, "http://a:1,http://b:2", "http://a:1,http://b:2"},
		{[]string{"--broker-url=http://c:3"}, "http://a:1,http://b:2", "http://c:3"},
	} {
		var got string
		cmd := &cobra.Command{Use: "x", RunE: func(cmd *cobra.Command, _ []string) error {
			return flagenv.Apply(cmd, func(k string) string {
				if k == "GPUPASS_BROKER_URL" {
					return tc.env
				}
				return ""
			})
		}}
		flagenv.ListVar(cmd.Flags(), &got, "broker-url", "")
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("args %q, env %q: %q, want %q", tc.args, tc.env, got, tc.want)
		}
	}
}
