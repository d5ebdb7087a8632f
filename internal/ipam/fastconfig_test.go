package ipam

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/ipledger/ipledger/internal/jsonlite"
)

var netConfCorpus = []string{
	`{"cniVersion":"1.0.0","name":"bench-ipam-ipl","type":"bench","ipam":{"type":"ipledger","socket":"/run/ipledger/ipledger.sock","spoolDir":"/var/lib/ipledger/spool","ranges":[[{"subnet":"10.247.0.0/22"}]]}}`,
	`{"cniVersion":"1.1.0","name":"k8s","type":"ipledger-veth","mtu":1450,"ipMasq":false,"isGateway":true,"args":{"x":[1,2,{"y":"z"}]},
	  "ipam":{"type":"ipledger","timeout":"5s","ranges":[ [ {"subnet":"10.1.0.0/24","gateway":"10.1.0.1"} ], [{"subnet":"fd00::/64"}] ],"extra":"x\"y"}}`,
	`{"cniVersion":"0.3.1","name":"n","type":"ptp","ipam":{"type":"ipledger","dataDir":"/tmp/x","ranges":[[{"subnet":"10.0.0.0/8"}]]}}`,
	`{"cniVersion":"1.0.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/8"}]],"routes":[{"dst":"0.0.0.0/0"}]}}`,
	`{"cniVersion":"1.0.0","name":"n","dns":{"nameservers":["1.1.1.1"]},"ipam":{}}`,
	`{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":[{"address":"10.0.0.2/24"}]},"ipam":{}}`,
	`{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[{"containerID":"c","ifname":"eth0"}],"ipam":{}}`,
	`{"cniVersion":"1.0.0","name":"n","capabilities":{"ips":true},"ipam":{}}`,
	`{"CNIVersion":"1.0.0","Name":"n","IPAM":{"Socket":"/x"}}`, `{"name":"a","name":"b"}`, `{"nAme":"x"}`, `{"ſame":1}`,
	`{"name":"a\u0062"}`, `{"name":null}`, `{"ipam":null}`, `{"ipam":{"ranges":null}}`, `{"ipam":{"ranges":[null]}}`,
	`{"ipam":{"timeout":5}}`, `{"ipam":{"socket":["x"]}}`, `{"name":"n"}x`, `{"name":"n"`, ``, `[]`, `{}`, `null`,
	`{"x":1e5,"y":-0.5,"z":true,"w":false,"v":"\\\"","u":{}}`, `{"x":[]}`, `{"x":null}`, "{\"name\":\"\xff\"}",
	`{"name":"n","ipam":{"type":"ipledger","ranges":[[{"subnet":"10.0.0.0/8","rangeStart":"10.0.0.10"}]],"TYPE":"x"}}`,
}

func checkNetConf(t *testing.T, data []byte) {
	t.Helper()
	var got, want NetConf
	gerr, werr := decodeNetConf(data, &got), json.Unmarshal(data, &want)
	if (gerr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual(got, want)) {
		t.Fatalf("%q:\n got %#v (%v)\nwant %#v (%v)", data, got, gerr, want, werr)
	}
}

// TestDecodeNetConfMatchesJSON: the hand-written config decoder gives what
// json.Unmarshal gives (value or error) for real configurations and odd ones, and
// the common shapes take the hand-written path.
func TestDecodeNetConfMatchesJSON(t *testing.T) {
	for _, s := range netConfCorpus {
		checkNetConf(t, []byte(s))
	}
	for _, s := range netConfCorpus[:3] {
		var c NetConf
		if d := jsonlite.NewDecoder([]byte(s)); !fastNetConf(d, &c) || !d.End() {
			t.Errorf("%s: left to encoding/json", s)
		}
	}
}

// FuzzDecodeNetConf: on any input the config decoder agrees with encoding/json.
func FuzzDecodeNetConf(f *testing.F) {
	for _, s := range netConfCorpus {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkNetConf(t, data) })
}

// FuzzCountRanges: the count by hand agrees with encoding/json's wherever it answers.
func FuzzCountRanges(f *testing.F) {
	for _, s := range []string{`[[{"subnet":"10.0.0.0/24"}]]`, `[[],[{},{}]]`, `[null]`, `[]`, `[[1,"x",[2]],[{"a":[1,2]}]]`, `[[{}] ]`, `{}`, `[[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, ok := countRanges(data)
		if !ok {
			return
		}
		var sets [][]json.RawMessage
		if err := json.Unmarshal(data, &sets); err != nil {
			t.Fatalf("%q: counted %d by hand, encoding/json refuses it: %v", data, n, err)
		}
		want := 0
		for _, s := range sets {
			want += len(s)
		}
		if n != want {
			t.Fatalf("%q: counted %d by hand, encoding/json %d", data, n, want)
		}
	})
}
