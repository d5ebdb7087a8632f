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

// TestSize: the short size under -short, the full size without it.
func TestSize(t *testing.T) {
	want := 100
	if testing.Short() {
		want = 10
	}
	if got := testenv.Size(100, 10); got != want {
		t.Fatalf("-short=%v: Size(100, 10) = %d, want %d", testing.Short(), got, want)
	}
}
