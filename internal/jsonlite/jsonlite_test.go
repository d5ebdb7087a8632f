package jsonlite

import (
	"encoding/json"
	"testing"
)

// TestSkip: Skip returns exactly the bytes of one JSON value (what json.RawMessage
// would hold) and refuses a bare null or a cut-off value.
func TestSkip(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{` "a\"b\\" ,`, `"a\"b\\"`, true},
		{`[[{"subnet":"10.0.0.0/8","x":[1,-2.5e3,true,{}]}]] `, `[[{"subnet":"10.0.0.0/8","x":[1,-2.5e3,true,{}]}]]`, true},
		{`{"a":{"b":[]}}}`, `{"a":{"b":[]}}`, true},
		{`12,`, `12`, true},
		{`null`, ``, false},
		{`[1,2`, ``, false},
		{`"abc`, ``, false},
		{``, ``, false},
	}
	for _, tt := range tests {
		got, ok := NewDecoder([]byte(tt.in)).Skip()
		if ok != tt.ok || string(got) != tt.want {
			t.Errorf("Skip(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
		if ok {
			var raw json.RawMessage
			if err := json.Unmarshal(got, &raw); err != nil || string(raw) != tt.want {
				t.Errorf("Skip(%q) gave %q, which encoding/json reads as %q (%v)", tt.in, got, raw, err)
			}
		}
	}
}

// TestSkippable: a key encoding/json would match to a field, case-insensitively or
// through Unicode folding, is never skippable.
func TestSkippable(t *testing.T) {
	known := []string{"name", "subnet"}
	for key, want := range map[string]bool{"mtu": true, "name": false, "NAME": false, "Subnet": false, "ſubnet": false, "names": true, "": true} {
		if got := Skippable(key, known...); got != want {
			t.Errorf("Skippable(%q) = %v, want %v", key, got, want)
		}
	}
}
