package ipam_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestBadInput execs the plugin as a runtime would, with one bad input per case: each
// must fail with the spec's JSON error on stdout, the right code and a message naming
// the field, and leave the ledger exactly as it was.
func TestBadInput(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	const good = `[[{"subnet":"10.81.0.0/24"}]]`
	conf := func(ranges string) string { return e.pluginConf("1.0.0", "badnet", ranges) }
	// a live pool and lease that nothing below may touch
	if _, cerr := execPlugin(t, call{Cmd: "ADD", ContainerID: "keeper", Netns: nsPath, Stdin: conf(good)}); cerr != nil {
		t.Fatal(cerr)
	}
	cases := badInputs(conf, good)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c.add(i, nsPath)
			e.t = t
			before := e.books()
			out, cerr := execPlugin(t, c)
			if cerr == nil {
				t.Fatalf("ADD succeeded: %s", out)
			}
			wantCode(t, cerr, tc.code, tc.words...)
			e.sameBooks(before)
		})
	}
}

// badCase is one bad input to ADD: the call, and the CNI error code and the words its
// message must carry.
type badCase struct {
	name  string
	c     call
	code  uint
	words []string
}

// badInputs are TestBadInput's cases: conf gives the stdin for a ranges value, good is
// a valid one (a pool that exists: the network keeps its ranges).
func badInputs(conf func(ranges string) string, good string) []badCase {
	return []badCase{
		{"malformed JSON", call{Stdin: `{"cniVersion":"1.0.0","name":"badnet","ipam":{`}, types.ErrDecodingFailure, []string{"JSON"}},
		{"JSON of the wrong shape", call{Stdin: strings.Replace(conf(good), `"ranges":`, `"routes":{"dst":1},"ranges":`, 1)}, types.ErrDecodingFailure, []string{"routes"}},
		{"unknown cniVersion", call{Stdin: strings.Replace(conf(good), `"1.0.0"`, `"9.9.9"`, 1)}, types.ErrIncompatibleCNIVersion, []string{"9.9.9"}},
		{"unparsable cniVersion", call{Stdin: strings.Replace(conf(good), `"1.0.0"`, `"one"`, 1)}, types.ErrIncompatibleCNIVersion, []string{"one"}},
		{"missing network name", call{Stdin: strings.Replace(conf(good), `"name":"badnet",`, ``, 1)}, types.ErrInvalidNetworkConfig, []string{"name"}},
		{"hostile network name", call{Stdin: strings.Replace(conf(good), `"badnet"`, `"../../etc"`, 1)}, types.ErrInvalidNetworkConfig, []string{"name"}},
		{"subnet not a CIDR", call{Stdin: conf(`[[{"subnet":"10.81.0.0/33"}]]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges[0][0].subnet", "10.81.0.0/33"}},
		{"subnet garbage", call{Stdin: conf(`[[{"subnet":"banana"}]]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges[0][0].subnet", "banana"}},
		{"blockSize not a prefix length", call{Stdin: strings.Replace(conf(good), `"ranges":`, `"blockSize":200,"ranges":`, 1)}, types.ErrInvalidNetworkConfig, []string{"ipam.blockSize", "200"}},
		{"subnet host bits", call{Stdin: conf(`[[{"subnet":"10.81.0.5/24"}]]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges[0][0].subnet"}},
		{"rangeStart not an IP", call{Stdin: conf(`[[{"subnet":"10.81.0.0/24","rangeStart":"10.81.0.x"}]]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges[0][0].rangeStart"}},
		{"rangeEnd outside subnet", call{Stdin: conf(`[[{"subnet":"10.81.0.0/24","rangeEnd":"10.82.0.9"}]]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges[0][0].rangeEnd"}},
		{"gateway other family", call{Stdin: conf(`[[{"subnet":"10.81.0.0/24","gateway":"fd00::1"}]]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges[0][0].gateway"}},
		{"overlapping ranges", call{Stdin: conf(`[[{"subnet":"10.81.0.0/24"},{"subnet":"10.81.0.0/25"}]]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges[0][1]", "overlaps"}},
		{"overlapping range sets", call{Stdin: conf(`[[{"subnet":"10.81.0.0/24"}],[{"subnet":"10.81.0.128/25"}]]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges[1][0]", "overlaps"}},
		{"empty ranges", call{Stdin: conf(`[]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges"}},
		{"empty range set", call{Stdin: conf(`[[]]`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges[0]"}},
		{"missing ranges", call{Stdin: conf(`null`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges"}},
		{"ranges not a list", call{Stdin: conf(`{"subnet":"10.81.0.0/24"}`)}, types.ErrInvalidNetworkConfig, []string{"ipam.ranges"}},
		{"range redefined for an existing network", call{Stdin: conf(`[[{"subnet":"10.82.0.0/24"}]]`)}, types.ErrInvalidNetworkConfig, []string{"badnet", "ranges", "10.81.0.0/24"}},
		{"range redefined for the existing attachment", call{ContainerID: "keeper", Stdin: conf(`[[{"subnet":"10.82.0.0/24"}]]`)}, types.ErrInvalidNetworkConfig, []string{"badnet", "ranges"}},
		{"bad route", call{Stdin: strings.Replace(conf(good), `"ranges":`, `"routes":[{"dst":"nowhere"}],"ranges":`, 1)}, types.ErrInvalidNetworkConfig, []string{"ipam.routes[0].dst"}},
		{"exclude not an address", call{Stdin: strings.Replace(conf(good), `"ranges":`, `"exclude":["10.81.0.x"],"ranges":`, 1)}, types.ErrInvalidNetworkConfig, []string{"ipam.exclude[0]", "10.81.0.x", "10.0.0.16/28"}},
		{"exclude host bits", call{Stdin: strings.Replace(conf(good), `"ranges":`, `"exclude":["10.81.0.9","10.81.0.5/28"],"ranges":`, 1)}, types.ErrInvalidNetworkConfig, []string{"ipam.exclude[1]", "10.81.0.0/28"}},
		{"bad timeout", call{Stdin: strings.Replace(conf(good), `"ranges":`, `"timeout":"soon","ranges":`, 1)}, types.ErrInvalidNetworkConfig, []string{"ipam.timeout"}},
		{"missing CNI_CONTAINERID", call{Unset: []string{"CNI_CONTAINERID"}, Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"CNI_CONTAINERID"}},
		{"empty CNI_CONTAINERID", call{ContainerID: "-", Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"CNI_CONTAINERID"}},
		{"5000-byte CNI_CONTAINERID", call{ContainerID: strings.Repeat("a", 5000), Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"CNI_CONTAINERID", "5000"}},
		{"path CNI_CONTAINERID", call{ContainerID: "../../etc", Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"containerID"}},
		{"newline CNI_CONTAINERID", call{ContainerID: "abc\ndef", Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"containerID"}},
		{"missing CNI_IFNAME", call{Unset: []string{"CNI_IFNAME"}, Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"CNI_IFNAME"}},
		{"long CNI_IFNAME", call{IfName: "eth0123456789abcdef", Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"interface name"}},
		{"path CNI_IFNAME", call{IfName: "../eth0", Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"interface name"}},
		{"dot CNI_IFNAME", call{IfName: "..", Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"interface name"}},
		{"CNI_ARGS without =", call{Args: "IgnoreUnknown=1;K8S_POD_NAME", Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"CNI_ARGS", "K8S_POD_NAME"}},
		{"CNI_ARGS with empty key", call{Args: "=x", Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"CNI_ARGS"}},
		{"CNI_ARGS control character", call{Args: "K8S_POD_NAME=a\x01b", Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"CNI_ARGS", "K8S_POD_NAME"}},
		{"CNI_ARGS oversized value", call{Args: "K8S_POD_UID=" + strings.Repeat("u", 600), Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"CNI_ARGS", "K8S_POD_UID"}},
		{"CNI_ARGS oversized", call{Args: strings.Repeat("A=b;", 5000), Stdin: conf(good)}, types.ErrInvalidEnvironmentVariables, []string{"CNI_ARGS"}},
		{"host network namespace", call{Netns: "/proc/self/ns/net", Stdin: conf(good)}, types.ErrInvalidNetNS, []string{"CNI_NETNS"}},
	}
}

// add is the ADD of a bad case numbered i: its own container ID unless the case sets
// one ("-": none), in the namespace at nsPath unless the case names another.
func (c call) add(i int, nsPath string) call {
	c.Cmd = "ADD"
	if c.ContainerID == "" {
		c.ContainerID = fmt.Sprintf("bad%02d", i)
	} else if c.ContainerID == "-" {
		c.ContainerID = ""
	}
	if c.Netns == "" {
		c.Netns = nsPath
	}
	return c
}
