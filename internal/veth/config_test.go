package veth_test

import (
	"errors"
	"testing"

	"github.com/ipledger/ipledger/internal/veth"
)

func TestHostVethName(t *testing.T) {
	a := veth.HostVethName("ipl", "net", "cid", "eth0")
	if a != veth.HostVethName("ipl", "net", "cid", "eth0") || len(a) != 15 || a[:3] != "ipl" {
		t.Fatalf("name %q", a)
	}
	for _, b := range []string{
		veth.HostVethName("ipl", "net2", "cid", "eth0"),
		veth.HostVethName("ipl", "net", "cid2", "eth0"),
		veth.HostVethName("ipl", "net", "cid", "eth1"),
	} {
		if b == a {
			t.Fatalf("collision %q", a)
		}
	}
	if n := veth.HostVethName("abcdefg", "n", "c", "i"); len(n) != 15 {
		t.Fatalf("name %q", n)
	}
}

func TestAliasRoundTrip(t *testing.T) {
	in := veth.Attachment{Network: "n", ContainerID: "c1", IfName: "eth0", NetNS: veth.NSID{Dev: 4, Ino: 4026532176}}
	s, err := in.Alias()
	if err != nil {
		t.Fatal(err)
	}
	out, ok := veth.ParseAlias(s)
	if !ok || out != in {
		t.Fatalf("%q -> %+v %v", s, out, ok)
	}
	for _, bad := range []string{"", "calico", "ipledger-veth net=n cid=c if=i", "ipledger-veth net=n cid=c if=i netns=x", "other net=n cid=c if=i netns=1:2"} {
		if _, ok := veth.ParseAlias(bad); ok {
			t.Fatalf("%q parsed as ours", bad)
		}
	}
}

func TestParseConfig(t *testing.T) {
	cases := []struct {
		name, conf string
		mtu        int
		prefix     string
		bad        bool
	}{
		{"defaults", `{"cniVersion":"1.0.0","name":"n","type":"ipledger-veth","ipam":{"type":"host-local"}}`, 0, "ipl", false},
		{"fields", `{"cniVersion":"1.0.0","name":"n","type":"ipledger-veth","mtu":9000,"hostVethPrefix":"pod","ipam":{"type":"ipledger"}}`, 9000, "pod", false},
		{"long-prefix", `{"cniVersion":"1.0.0","name":"n","type":"ipledger-veth","hostVethPrefix":"toolongpfx","ipam":{"type":"x"}}`, 0, "", true},
		{"bad-prefix", `{"cniVersion":"1.0.0","name":"n","type":"ipledger-veth","hostVethPrefix":"a b","ipam":{"type":"x"}}`, 0, "", true},
		{"bad-mtu", `{"cniVersion":"1.0.0","name":"n","type":"ipledger-veth","mtu":20,"ipam":{"type":"x"}}`, 0, "", true},
		{"negative-mtu", `{"cniVersion":"1.0.0","name":"n","type":"ipledger-veth","mtu":-1,"ipam":{"type":"x"}}`, 0, "", true},
		{"no-ipam", `{"cniVersion":"1.0.0","name":"n","type":"ipledger-veth"}`, 0, "", true},
		{"not-json", `{`, 0, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf, err := veth.ParseConfig([]byte(c.conf))
			if c.bad {
				if !errors.Is(err, veth.ErrConfig) {
					t.Fatalf("err %v, want ErrConfig", err)
				}
				return
			}
			if err != nil || conf.MTU != c.mtu || conf.HostVethPrefix != c.prefix {
				t.Fatalf("%+v %v", conf, err)
			}
		})
	}
}
