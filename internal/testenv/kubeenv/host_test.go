package kubeenv

import (
	"reflect"
	"testing"
)

// TestSplitWords: iptables -S lines become the words that -D takes back,
// quoted comments kept whole.
func TestSplitWords(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
	}{
		{"-N KUBE-FIREWALL", []string{"-N", "KUBE-FIREWALL"}},
		{`-A INPUT -j KUBE-FIREWALL`, []string{"-A", "INPUT", "-j", "KUBE-FIREWALL"}},
		{`-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
			[]string{"-A", "KUBE-FIREWALL", "!", "-s", "127.0.0.0/8", "-d", "127.0.0.0/8", "-m", "comment", "--comment", "block incoming localnet connections", "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP"}},
		{`-A X -m comment --comment "say \"hi\"" -j Y`, []string{"-A", "X", "-m", "comment", "--comment", `say "hi"`, "-j", "Y"}},
		{`-A X -m comment --comment "" -j Y`, []string{"-A", "X", "-m", "comment", "--comment", "", "-j", "Y"}},
	} {
		if got := splitWords(c.line); !reflect.DeepEqual(got, c.want) {
			t.Errorf("splitWords(%q) = %q, want %q", c.line, got, c.want)
		}
	}
}
