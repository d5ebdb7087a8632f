package pool

import "testing"

// SetsString is what the pool-conflict and pool-mismatch errors show of the ranges.
func TestSetsString(t *testing.T) {
	sets, err := ParseRangeSets([]byte(`[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.1.0/24"}],[{"subnet":"fd00::/120"}]]`))
	if err != nil {
		t.Fatal(err)
	}
	want := "[[" + sets[0].String() + "] [" + sets[1].String() + "]]"
	if got := SetsString(sets); got != want {
		t.Fatalf("SetsString = %s, want %s", got, want)
	}
	if got := SetsString(nil); got != "[]" {
		t.Fatalf("SetsString(nil) = %s, want []", got)
	}
}
