package testenv_test

import (
	"testing"

	"github.com/ipledger/ipledger/internal/testenv"
)

// TestSkipIfShort: under -short the test stops skipped, without it it goes on.
func TestSkipIfShort(t *testing.T) {
	ran := false
	t.Run("inner", func(t *testing.T) {
		testenv.SkipIfShort(t, "needs nothing; this is the check")
		ran = true
	})
	if ran == testing.Short() {
		t.Fatalf("-short=%v, the test went on past SkipIfShort: %v", testing.Short(), ran)
	}
}
