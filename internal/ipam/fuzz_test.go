package ipam

import (
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cniplugin"
	"github.com/ipledger/ipledger/internal/pool"
)

// FuzzParseConfig: ParseConfig never panics; a config it accepts has a valid network
// name, socket, timeout and, when ranges are given, ranges that pass pool.Validate;
// a rejection is a CNI error with a code and a message.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipledger","ranges":[[{"subnet":"10.0.0.0/24"}]]}}`,
		`{"cniVersion":"1.0.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.10","rangeEnd":"10.0.0.20","gateway":"10.0.0.1"}],[{"subnet":"fd00::/64"}]],"routes":[{"dst":"0.0.0.0/0"}]}}`,
		`{"name":"n","ipam":{"ranges":[[{"subnet":"::ffff:10.0.0.0/120"}]]}}`,
		`{"name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.0.0/25"}]]}}`,
		`{"name":"n","ipam":{"ranges":[]}}`,
		`{"name":"n","ipam":{"timeout":"1s","routes":[{"dst":"x"}]}}`,
		`{"name":"n","ipam":{"ranges":[[{"subnet":"fe80::/64","gateway":"fe80::1%eth0"}]]}}`,
		`{"name":"n","ipam":{"ranges":[[{"subnet":"0.0.0.0/0"}],[{"subnet":"::/0"}]]}}`,
		`{"name":"n","cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],"ipam":{}}`,
		`{`, `null`, `[]`, `{"name":1}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, data []byte, needRanges bool) {
		conf, cerr := ParseConfig(data, needRanges)
		if cerr != nil {
			if conf != nil || cerr.Code == 0 || cerr.Msg == "" {
				t.Fatalf("rejection %+v with conf %v", cerr, conf)
			}
			return
		}
		if err := (api.Key{Network: conf.Name, ContainerID: "c", IfName: "eth0"}).Validate(); err != nil {
			t.Fatalf("accepted network name %q: %v", conf.Name, err)
		}
		c := conf.IPAM
		if c.Socket == "" || c.timeout <= 0 {
			t.Fatalf("accepted config without socket or timeout: %+v", c)
		}
		if needRanges && len(c.ranges) == 0 {
			t.Fatalf("accepted config without ranges: %s", data)
		}
		if len(c.ranges) > 0 {
			if err := pool.Validate(c.ranges); err != nil {
				t.Fatalf("accepted ranges fail pool.Validate: %v", err)
			}
			for i, set := range c.ranges {
				for j, r := range set {
					if _, err := r.Canonical("r"); err != nil || !r.Subnet.Contains(r.RangeStart) || !r.Subnet.Contains(r.RangeEnd) || r.RangeEnd.Less(r.RangeStart) || !r.Subnet.Contains(r.Gateway) || r.Subnet.Addr().Zone() != "" {
						t.Fatalf("accepted range [%d][%d] %+v is not canonical: %v", i, j, r, err)
					}
				}
			}
		}
		for i, r := range c.Routes {
			if r == nil || r.Dst.IP == nil {
				t.Fatalf("accepted route %d without dst", i)
			}
		}
	})
}

// FuzzPodArgs: PodArgs never panics; accepted values are bounded and free of control
// characters; a rejection is an env-variable error naming CNI_ARGS.
func FuzzPodArgs(f *testing.F) {
	for _, s := range []string{
		"", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1234",
		"K8S_POD_NAME", "=x", ";;;", "K8S_POD_NAME=a=b", "K8S_POD_UID=\x00", "K8S_POD_NAME=" + strings.Repeat("x", 600),
		"K8S_POD_NAME=\xff\xfe;K8S_POD_UID=ü",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pod, cerr := PodArgs(s)
		if cerr != nil {
			if cerr.Code != cniplugin.ErrInvalidEnvironmentVariables || !strings.HasPrefix(cerr.Msg, "CNI_ARGS") {
				t.Fatalf("rejection %+v", cerr)
			}
			return
		}
		for _, v := range []string{pod.Namespace, pod.Name, pod.UID} {
			if len(v) > maxArgValue {
				t.Fatalf("accepted %d-byte value", len(v))
			}
			for _, c := range []byte(v) {
				if c < ' ' || c == 0x7f {
					t.Fatalf("accepted control character in %q", v)
				}
			}
			if !strings.Contains(s, v) {
				t.Fatalf("value %q not from %q", v, s)
			}
		}
	})
}

// FuzzParseDelConfig: ParseDelConfig never panics; a config it accepts has a valid
// network name, a socket and a positive timeout; a rejection is a CNI error.
func FuzzParseDelConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipledger","socket":"/run/x.sock","timeout":"soon","ranges":"bad","routes":{"dst":1}},"mtu":"x"}`,
		`{"name":"n"}`, `{"name":"n","ipam":5}`, `{"name":"n","ipam":{"socket":""}}`, `{"name":"../x"}`,
		`{`, `null`, `[]`, `{"name":1}`, `{"name":"n","ipam":{"timeout":"-1s"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		conf, _, cerr := ParseDelConfig(data)
		if cerr != nil {
			if conf != nil || cerr.Code == 0 || cerr.Msg == "" {
				t.Fatalf("rejection %+v with conf %v", cerr, conf)
			}
			return
		}
		if err := (api.Key{Network: conf.Name, ContainerID: "c", IfName: "eth0"}).Validate(); err != nil {
			t.Fatalf("accepted network name %q: %v", conf.Name, err)
		}
		if conf.IPAM.Socket == "" || conf.IPAM.timeout <= 0 {
			t.Fatalf("accepted config without socket or timeout: %+v", conf.IPAM)
		}
	})
}

// FuzzFromConflist: FromConflist never panics, and what it accepts is what
// ParseConfig accepts for an ADD: a valid name and ranges.
func FuzzFromConflist(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ipledger-veth","ipam":{"type":"ipledger","blockSize":26,"ranges":[[{"subnet":"10.244.0.0/16"}]]}},{"type":"portmap"}]}`,
		`{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"ipledger","ranges":[[{"subnet":"usePodCidr"}]]}}]}`,
		`{"name":"n","plugins":[{"ipam":{"type":"ipledger"}}]}`,
		`{"plugins":[null]}`, `{"plugins":[{"ipam":null}]}`, `{`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		conf, err := FromConflist(data)
		if err != nil {
			if conf != nil || err.Error() == "" {
				t.Fatalf("rejection %v with conf %v", err, conf)
			}
			return
		}
		if err := (api.Key{Network: conf.Name, ContainerID: "c", IfName: "eth0"}).Validate(); err != nil {
			t.Fatalf("accepted network name %q: %v", conf.Name, err)
		}
		if err := pool.Validate(conf.IPAM.RangeSets()); err != nil && !pool.HasPodCIDR(conf.IPAM.RangeSets()) {
			t.Fatalf("accepted ranges %s: %v", pool.SetsString(conf.IPAM.RangeSets()), err)
		}
	})
}
