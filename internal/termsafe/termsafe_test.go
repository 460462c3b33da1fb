package termsafe

import "testing"

func TestString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain text, ünïcödé ✓ 中文", "plain text, ünïcödé ✓ 中文"},
		{"nul \x00 bell \x07 del \x7f", `nul \x00 bell \x07 del \x7f`},
		{"tab\tnl\ncr\r", `tab\tnl\ncr\r`},
		{"\x1b[2Jcleared", `\x1b[2Jcleared`},
		{"\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\", `\x1b]8;;http://evil/\x1b\link\x1b]8;;\x1b\`},
		{"c1 \u0085 \u009b2J", `c1 \u0085 \u009b2J`},
		{"bidi \u202eevil\u202a\u2066\u2069 \u200f", `bidi \u202eevil\u202a\u2066\u2069 \u200f`},
		{"bad utf-8 \xff\xfe", `bad utf-8 \xff\xfe`},
	} {
		if got := String(tc.in); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
