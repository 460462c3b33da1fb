package flagenv

import (
	"strings"

	"github.com/spf13/pflag"
)

// ListVar defines a string flag that may be given several times and takes
// a comma-separated list too: its value is every item given, joined by
// commas (so that "--broker-url A --broker-url B", "--broker-url A,B" and
// GPUPASS_BROKER_URL=A,B say the same). Its environment variable, applied
// only when the flag was not given, is one comma-separated list.
func ListVar(fs *pflag.FlagSet, p *string, name, usage string) {
	*p = "" // as StringVar's empty default
	fs.Var((*listValue)(p), name, usage)
}

type listValue string

func (l *listValue) Set(s string) error {
	var items []string
	if *l != "" {
		items = append(items, string(*l))
	}
	for it := range strings.SplitSeq(s, ",") {
		if it = strings.TrimSpace(it); it != "" {
			items = append(items, it)
		}
	}
	*l = listValue(strings.Join(items, ","))
	return nil
}

func (l *listValue) String() string { return string(*l) }
func (l *listValue) Type() string   { return "strings" }
