package pool

import (
	"encoding/json"
	"reflect"
	"testing"
)

var rawCorpus = []string{
	`[[{"subnet":"10.247.0.0/22"}]]`,
	` [ [ {"subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.20","gateway":"10.1.0.1","x":[1,{"y":null}]} ], [{"subnet":"fd00::/64"}] ] `,
	`[]`, `[[]]`, `null`, `[null]`, `[[null]]`, `[[{"subnet":null}]]`, `[[{"Subnet":"10.0.0.0/8"}]]`, `[[{"subnet":"a","subnet":"b"}]]`,
	`[[{"subnet":"a\u0062"}]]`, `[[{"subnet":1}]]`, `[[{"ſubnet":"x"}]]`, `[[{}]]`, `[[{"subnet":"x"}]`, `[[{"subnet":"x"}]]x`, ``, `{}`,
}

// TestDecodeRawMatchesJSON: the hand-written ranges decoder gives what json.Unmarshal
// gives, and the common shapes take the hand-written path.
func TestDecodeRawMatchesJSON(t *testing.T) {
	for _, s := range rawCorpus {
		got, gerr := decodeRaw([]byte(s))
		var want [][]rawRange
		werr := json.Unmarshal([]byte(s), &want)
		if (gerr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual(got, want)) {
			t.Errorf("%q:\n got %#v (%v)\nwant %#v (%v)", s, got, gerr, want, werr)
		}
	}
}

// FuzzDecodeRaw: on any input the ranges decoder agrees with encoding/json.
func FuzzDecodeRaw(f *testing.F) {
	for _, s := range rawCorpus {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, gerr := decodeRaw(data)
		var want [][]rawRange
		werr := json.Unmarshal(data, &want)
		if (gerr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual(got, want)) {
			t.Fatalf("%q:\n got %#v (%v)\nwant %#v (%v)", data, got, gerr, want, werr)
		}
	})
}
