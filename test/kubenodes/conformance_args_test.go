package kubenodes_test

import (
	"fmt"
	"strings"
	"testing"
)

func TestConformanceArgsError(t *testing.T) {
	if err := conformanceArgsError(nil); err != nil {
		t.Errorf("no leftover words: %v", err)
	}
	err := conformanceArgsError([]string{"KubeProxy"})
	if err == nil || !strings.Contains(err.Error(), `"KubeProxy"`) || !strings.Contains(err.Error(), "CONFORMANCE_ARGS") {
		t.Errorf("leftover word: got %v, want an error naming the word and CONFORMANCE_ARGS", err)
	}
}

// conformanceArgsError refuses words left over after the flags: the shell split
// an unquoted CONFORMANCE_ARGS, so the focus would be only its first word (and
// `\[sig-network\]` without its backslashes is a character class that selects
// every test of the suite).
func conformanceArgsError(rest []string) error {
	if len(rest) == 0 {
		return nil
	}
	return fmt.Errorf("conformance: unexpected argument %q after the flags: CONFORMANCE_ARGS was split by the shell; quote a focus with spaces inside the variable, e.g. make conformance CONFORMANCE_ARGS=\"'-conformance.focus=KubeProxy should'\"", strings.Join(rest, " "))
}
