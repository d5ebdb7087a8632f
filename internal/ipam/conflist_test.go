package ipam

import (
	"errors"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/pool"
)

// FromConflist finds the ipledger ipam config in a conflist, with the list's
// name, and refuses what an ADD would refuse, naming the field.
func TestFromConflist(t *testing.T) {
	const veth = `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[
		{"type":"ipledger-veth","ipam":{"type":"ipledger","blockSize":27,"ranges":[[{"subnet":"10.244.0.0/16"}]]}},
		{"type":"portmap","capabilities":{"portMappings":true}}]}`
	conf, err := FromConflist([]byte(veth))
	if err != nil {
		t.Fatal(err)
	}
	if conf.Name != "k8s-pod-network" || conf.IPAM.BlockSize != 27 || len(conf.IPAM.RangeSets()) != 1 || !strings.Contains(pool.SetsString(conf.IPAM.RangeSets()), "10.244.0.0/16") {
		t.Fatalf("read %q blockSize %d ranges %s", conf.Name, conf.IPAM.BlockSize, pool.SetsString(conf.IPAM.RangeSets()))
	}
	for _, tc := range []struct{ name, conf, want string }{
		{"not JSON", `{`, "not a network config list"},
		{"no ipledger ipam", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`, `no plugin with "ipam": {"type": "ipledger"}`},
		{"no name", `{"cniVersion":"1.0.0","plugins":[{"type":"ipledger-veth","ipam":{"type":"ipledger","ranges":[[{"subnet":"10.0.0.0/24"}]]}}]}`, "plugins[0]: name: missing"},
		{"bad range", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x"},{"type":"ipledger-veth","ipam":{"type":"ipledger","ranges":[[{"subnet":"10.0.0.0/33"}]]}}]}`, "plugins[1]: ipam.ranges"},
		{"no ranges", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ipledger-veth","ipam":{"type":"ipledger"}}]}`, "plugins[0]: ipam.ranges: missing"},
		{"bad plugin", `{"cniVersion":"1.0.0","name":"n","plugins":[7]}`, "plugins[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromConflist([]byte(tc.conf))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if tc.name == "no ipledger ipam" && !errors.Is(err, ErrNoIPAM) {
				t.Fatalf("%v is not ErrNoIPAM", err)
			}
		})
	}
}
