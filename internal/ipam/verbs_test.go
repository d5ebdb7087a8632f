package ipam_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ipam"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// ctl runs ipledgerctl against the agent; it returns stdout and the exit status.
func (e *env) ctl(args ...string) ([]byte, int) {
	e.t.Helper()
	out, _, code := agentenv.Ctl(e.t, append([]string{"--socket", e.a.Socket}, args...)...)
	return []byte(out), code
}

// TestAgentUnreachable: ADD fails with code 11 naming the socket; STATUS answers 50;
// DEL fails with code 11 naming the socket while no agent has published a spool for
// it, and once one has, DEL is spooled there and succeeds.
func TestAgentUnreachable(t *testing.T) {
	nsPath := netenv.Namespace(t, "ipl").Path
	sock := filepath.Join(t.TempDir(), "nobody.sock")
	spoolDir := filepath.Join(t.TempDir(), "spool")
	c := ctx(t)
	cni := newRuntime(t)
	for _, v := range []string{"0.3.1", "1.1.0"} {
		l := confList(t, fmt.Sprintf(`{"cniVersion":%q,"name":"gone","plugins":[{"type":"ipledger","ipam":{"type":"ipledger","socket":%q,"ranges":[[{"subnet":"10.84.0.0/24"}]]}}]}`, v, sock))
		_, err := cni.AddNetworkList(c, l, rt("lonely", nsPath))
		wantCode(t, err, types.ErrTryAgainLater, sock)
		if v == "1.1.0" {
			wantCode(t, cni.GetStatusNetworkList(c, l), types.ErrPluginNotAvailable, sock)
		}
		os.Remove(spool.Pointer(sock))
		wantCode(t, cni.DelNetworkList(c, l, rt("lonely", "")), types.ErrTryAgainLater, sock, spool.Pointer(sock))

		// an agent that served sock once published its spool there
		if err := spool.Publish(sock, spoolDir); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := cni.DelNetworkList(c, l, rt("lonely", "")); err != nil {
				t.Fatalf("DEL with the agent down: %v", err)
			}
		}
		// the DEL answered success because it is in the spool (one entry per
		// attachment, however often it is repeated)
		spooled, err := spool.Open(spoolDir, func() time.Duration { return 0 }).Pending()
		want := api.Key{Network: "gone", ContainerID: "lonely", IfName: "eth0"}
		if err != nil || len(spooled) != 1 || spooled[0] != want {
			t.Fatalf("after DEL %s the spool holds %v (%v), want exactly %v", v, spooled, err, want)
		}
	}
}

// TestStatusUnreachableMessage: the STATUS error a runtime shows as its
// NetworkReady message ("Network plugin returns error: ...", the kubelet's Node
// condition) says once that ipledgerd is not reachable, names the socket once
// and gives the cause: no "agent unreachable" repeating it.
func TestStatusUnreachableMessage(t *testing.T) {
	dir, err := os.MkdirTemp("", "ipl") // a path without the test's name in it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "nobody.sock")
	l := confList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"gone","plugins":[{"type":"ipledger","ipam":{"type":"ipledger","socket":%q,"ranges":[[{"subnet":"10.84.0.0/24"}]]}}]}`, sock))
	err = newRuntime(t).GetStatusNetworkList(ctx(t), l)
	wantCode(t, err, types.ErrPluginNotAvailable, sock)
	msg := err.Error()
	if strings.Count(msg, sock) != 1 || strings.Count(msg, "reachable") != 1 || !strings.Contains(msg, "no such file or directory") {
		t.Fatalf("STATUS error %q: want the socket and \"not reachable\" once, with the cause", msg)
	}
	t.Logf("STATUS error: %s", msg)
}

// TestStatusExhausted: STATUS answers 50 once the network's pool has nothing to give,
// and ADD then fails with the plugin's exhausted code.
func TestStatusExhausted(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	// a /30 has one address to give: .1 is the gateway, .3 the broadcast
	l := e.list("1.1.0", "tiny", `[[{"subnet":"10.83.0.0/30"}]]`)
	c := ctx(t)
	if err := e.cni.GetStatusNetworkList(c, l); err != nil {
		t.Fatalf("STATUS of a network without a pool yet: %v", err)
	}
	res, err := e.cni.AddNetworkList(c, l, rt("only", nsPath))
	if err != nil {
		t.Fatal(err)
	}
	if ips := resultIPs(t, res); !slices.Equal(ips, []string{"10.83.0.2/30"}) {
		t.Fatalf("ADD gave %v", ips)
	}
	wantCode(t, e.cni.GetStatusNetworkList(c, l), types.ErrPluginNotAvailable, "tiny")
	_, err = e.cni.AddNetworkList(c, l, rt("second", nsPath))
	wantCode(t, err, ipam.ErrPoolExhausted, "tiny")
	if got := ipsOf(e.a.Leases(t), "tiny", "second"); got != nil {
		t.Fatalf("failed ADD left a lease %v", got)
	}
}

// TestGC: GC releases, reason GC, every lease of the network not in
// cni.dev/valid-attachments (or cni.dev/attachments), keeps the valid ones and leaves
// other networks alone; without a list it refuses and releases nothing.
func TestGC(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	c := ctx(t)
	la := e.list("1.1.0", "gca", `[[{"subnet":"10.85.0.0/24"}]]`)
	lb := e.list("1.1.0", "gcb", `[[{"subnet":"10.86.0.0/24"}]]`)
	for _, id := range []string{"a1", "a2", "a3", "a4"} {
		if _, err := e.cni.AddNetworkList(c, la, rt(id, nsPath)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.cni.AddNetworkList(c, lb, rt("b1", nsPath)); err != nil {
		t.Fatal(err)
	}
	before := e.a.Leases(t)

	// without a list: refused, nothing released
	_, cerr := execPlugin(t, call{Cmd: "GC", Stdin: e.pluginConf("1.1.0", "gca", `[[{"subnet":"10.85.0.0/24"}]]`)})
	wantCode(t, cerr, types.ErrInvalidNetworkConfig, "cni.dev/valid-attachments")
	if got := e.a.Leases(t); len(got) != len(before) {
		t.Fatalf("GC without a list changed the leases: %v", got)
	}

	// a runtime with an empty cache: only the plugin's GC acts
	if err := newRuntime(t).GCNetworkList(c, la, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "a1", IfName: "eth0"}, {ContainerID: "a4", IfName: "eth0"}, {ContainerID: "b1", IfName: "eth0"}}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	after := e.a.Leases(t)
	for _, id := range []string{"a1", "a4"} {
		if !slices.Equal(ipsOf(after, "gca", id), ipsOf(before, "gca", id)) {
			t.Fatalf("GC touched valid attachment %s", id)
		}
	}
	if !slices.Equal(ipsOf(after, "gcb", "b1"), ipsOf(before, "gcb", "b1")) {
		t.Fatal("GC of gca touched network gcb")
	}
	for _, id := range []string{"a2", "a3"} {
		if ipsOf(after, "gca", id) != nil {
			t.Fatalf("GC kept %s, not in the valid list", id)
		}
		e.wantReleased(ipsOf(before, "gca", id)[0], "gca", id, ledger.ReasonGC)
	}

	// the spec's older key, cni.dev/attachments, as a plugin receives it alone
	stdin := strings.TrimSuffix(e.pluginConf("1.1.0", "gca", `[[{"subnet":"10.85.0.0/24"}]]`), "}") + `,"cni.dev/attachments":[{"containerID":"a4","ifname":"eth0"}]}`
	if _, cerr := execPlugin(t, call{Cmd: "GC", Stdin: stdin}); cerr != nil {
		t.Fatalf("GC with cni.dev/attachments: %v", cerr)
	}
	after = e.a.Leases(t)
	if ipsOf(after, "gca", "a1") != nil || ipsOf(after, "gca", "a4") == nil || ipsOf(after, "gcb", "b1") == nil {
		t.Fatalf("GC with cni.dev/attachments [a4]: leases %v", after)
	}
	e.wantReleased(ipsOf(before, "gca", "a1")[0], "gca", "a1", ledger.ReasonGC)
}

// wantReleased checks with `ipledgerctl history` that the last holder of ip was
// containerID and why it was released.
func (e *env) wantReleased(cidr, network, containerID string, reason ledger.Reason) {
	e.t.Helper()
	ip, _, _ := strings.Cut(cidr, "/")
	out, code := e.ctl("history", "--network", network, "--ip", ip, "-o", "json")
	if code != 0 {
		e.t.Fatalf("ipledgerctl history exited %d", code)
	}
	var h []ledger.Release
	if err := json.Unmarshal(out, &h); err != nil || len(h) == 0 {
		e.t.Fatalf("history of %s: %v %s", ip, err, out)
	}
	last := h[len(h)-1]
	if last.Key.ContainerID != containerID || last.Reason != reason {
		e.t.Fatalf("history of %s ends with %+v, want %s released by %s", ip, last, containerID, reason)
	}
}

// TestCheckFails: CHECK fails when the lease is gone and when prevResult's addresses
// differ from the lease's.
func TestCheckFails(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	c := ctx(t)
	l := e.list("1.0.0", "chk", dualRanges)
	res, err := e.cni.AddNetworkList(c, l, rt("c1", nsPath))
	if err != nil {
		t.Fatal(err)
	}
	ips := resultIPs(t, res)
	if err := e.cni.CheckNetworkList(c, l, rt("c1", nsPath)); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	conf := e.pluginConf("1.0.0", "chk", dualRanges)
	prev := func(addrs ...string) string {
		var parts []string
		for _, a := range addrs {
			parts = append(parts, fmt.Sprintf(`{"address":%q}`, a))
		}
		return strings.TrimSuffix(conf, "}") + `,"prevResult":{"cniVersion":"1.0.0","ips":[` + strings.Join(parts, ",") + `]}}`
	}
	if _, cerr := execPlugin(t, call{Cmd: "CHECK", ContainerID: "c1", Netns: nsPath, Stdin: prev(ips...)}); cerr != nil {
		t.Fatalf("CHECK with the right prevResult: %v", cerr)
	}
	_, cerr := execPlugin(t, call{Cmd: "CHECK", ContainerID: "c1", Netns: nsPath, Stdin: prev("10.77.0.250/24", ips[1])})
	wantCode(t, cerr, ipam.ErrCheckFailed, "10.77.0.250")
	_, cerr = execPlugin(t, call{Cmd: "CHECK", ContainerID: "c1", Netns: nsPath, Stdin: prev(ips[0])})
	wantCode(t, cerr, ipam.ErrCheckFailed, "c1")

	if _, code := e.ctl("release", "--network", "chk", "--container-id", "c1", "--reason", "test"); code != 0 {
		t.Fatalf("ipledgerctl release exited %d", code)
	}
	wantCode(t, e.cni.CheckNetworkList(c, l, rt("c1", nsPath)), ipam.ErrCheckFailed, "c1", "no lease")
	e.wantReleased(ips[0], "chk", "c1", ledger.ReasonManual)
}

// TestDelWithBrokenRanges: a config whose ranges became invalid after ADD (an operator
// edit) still lets DEL release; ADD with it is refused.
func TestDelWithBrokenRanges(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	if _, cerr := execPlugin(t, call{Cmd: "ADD", ContainerID: "held", Netns: nsPath, Stdin: e.pluginConf("1.0.0", "brk", `[[{"subnet":"10.89.0.0/24"}]]`)}); cerr != nil {
		t.Fatal(cerr)
	}
	broken := e.pluginConf("1.0.0", "brk", `[[{"subnet":"10.89.0.0/33"}]]`)
	_, cerr := execPlugin(t, call{Cmd: "ADD", ContainerID: "other", Netns: nsPath, Stdin: broken})
	wantCode(t, cerr, types.ErrInvalidNetworkConfig, "ipam.ranges[0][0].subnet")
	if _, cerr := execPlugin(t, call{Cmd: "DEL", ContainerID: "held", Stdin: broken}); cerr != nil {
		t.Fatalf("DEL with broken ranges: %v", cerr)
	}
	if l := e.a.Leases(t); len(l) != 0 {
		t.Fatalf("DEL with broken ranges left %v", l)
	}
}

// TestPodIdentityRecorded: the pod identity kubelet passes in CNI_ARGS and the
// namespace's identity are recorded with the lease and shown by `ipledgerctl leases`.
func TestPodIdentityRecorded(t *testing.T) {
	e := newEnv(t, agentenv.Options{})
	nsPath := netenv.Namespace(t, "ipl").Path
	var st syscall.Stat_t
	if err := syscall.Stat(nsPath, &st); err != nil {
		t.Fatal(err)
	}
	args := "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=sbx1;K8S_POD_UID=6a0b-uid"
	if _, cerr := execPlugin(t, call{Cmd: "ADD", ContainerID: "sbx1", Netns: nsPath, Args: args,
		Stdin: e.pluginConf("1.0.0", "ident", `[[{"subnet":"10.87.0.0/24"}]]`)}); cerr != nil {
		t.Fatalf("ADD: %+v", cerr)
	}
	t.Cleanup(func() {
		if _, cerr := execPlugin(t, call{Cmd: "DEL", ContainerID: "sbx1", Stdin: e.pluginConf("1.0.0", "ident", `[[{"subnet":"10.87.0.0/24"}]]`)}); cerr != nil {
			t.Errorf("DEL: %+v", cerr)
		}
	})
	ls := e.a.Leases(t)
	if len(ls) != 1 {
		t.Fatalf("leases %+v, want one", ls)
	}
	got := ls[0]
	want := api.LeaseView{Namespace: "shop", Name: "web-0", UID: "6a0b-uid", Infra: "sbx1", NetNS: nsPath, NetNSID: fmt.Sprintf("%d:%d", st.Dev, st.Ino)}
	if got.Namespace != want.Namespace || got.Name != want.Name || got.UID != want.UID || got.Infra != want.Infra || got.NetNS != want.NetNS || got.NetNSID != want.NetNSID {
		t.Errorf("lease identity %+v, want namespace/name/uid/infra/netns/netnsID of %+v", got, want)
	}
}
