package runtime_test

import (
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/chromium"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// ctl runs the real ipledgerctl against the world's agent.
func (w *world) ctl(args ...string) (string, int) {
	w.t.Helper()
	out, errOut, code := agentenv.Ctl(w.t, append([]string{"--socket", w.agent.Socket}, args...)...)
	w.t.Logf("ipledgerctl %s (exit %d):\n%s%s", strings.Join(args, " "), code, out, errOut)
	return out + errOut, code
}

// TestOperatorSurfaceOnRealRuntime: against a real containerd, with one pod READY and
// one whose chained plugin failed its teardown (its sandbox NOTREADY, its address
// still in its namespace: stranded), the operator's tools say so: leases shows the sandbox states
// and verdicts, audit explains the stranded lease and its likely cause, the metrics
// count it, the pool page colours its cell, doctor names the runtime and its version,
// and release refuses the READY pod's lease unless forced, while it releases the
// NOTREADY one.
func TestOperatorSurfaceOnRealRuntime(t *testing.T) {
	metrics := netenv.FreeAddr(t)
	w := newWorld(t, "iplop0", "10.246.9.0/24", "--metrics-addr", metrics)
	const network = "ops"
	w.setConf(w.conflist(network, w.ipledgerIPAM(), true))
	// a lease whose sandbox the runtime never had (an ADD whose sandbox creation
	// failed after it): the reconciler releases it, reason reconcile-gone
	if _, err := w.agent.Call(api.Request{Op: api.OpAdd, Network: network, ContainerID: "ghost", IfName: "eth0", Ranges: mustRanges(t, w.subnet),
		Pod: api.Pod{Namespace: "default", Name: "ghost", UID: "uid-ghost"}}); err != nil {
		t.Fatal(err)
	}
	// the stuck pod: its sandbox stopped while the chained plugin fails DEL, so
	// it is NOTREADY with its address still configured, on every runtime
	// (containerd 2.x removes a sandbox whose ADD failed, 1.6 and 1.7 keep it)
	w.setConf(w.conflist(network, w.ipledgerIPAM(), false))
	stuckID, err := w.run(cri.PodSpec{Namespace: "default", Name: "stuck", UID: "uid-stuck", LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	w.setConf(w.conflist(network, w.ipledgerIPAM(), true))
	if err := w.c.StopPodSandbox(w.ctx, stuckID); err == nil || !strings.Contains(err.Error(), "failer") {
		t.Fatalf("StopPodSandbox with the failer: %v", err)
	}
	w.setConf(w.conflist(network, w.ipledgerIPAM(), false))
	webID, err := w.run(cri.PodSpec{Namespace: "default", Name: "web", UID: "uid-web", LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ls := w.waitLeases(15*time.Second, "one stranded and one READY lease", func(ls []api.LeaseView) bool {
		var stranded, ready int
		for _, v := range ls {
			if v.Verdict == api.VerdictStranded && v.Sandbox == "NOTREADY" {
				stranded++
			}
			if v.Sandbox == "READY" && v.Verdict == "" {
				ready++
			}
		}
		return len(ls) == 2 && stranded == 1 && ready == 1 // the ghost's lease is gone
	})
	var stuck, web api.LeaseView
	for _, v := range ls {
		if v.Name == "stuck" {
			stuck = v
		} else {
			web = v
		}
	}

	out, code := w.ctl("leases", "--network", network)
	// PHASE is "-": no Kubernetes API here to tell the pods' phases.
	if code != 0 || !regexp.MustCompile(`default/stuck\s+-\s+\d+s\s+NOTREADY\s+stranded \(stranded: `).MatchString(out) ||
		!regexp.MustCompile(`default/web\s+-\s+\d+s\s+READY\s+-\s+default pool\n`).MatchString(out) {
		t.Errorf("leases table does not show the sandbox states and verdicts")
	}
	out, code = w.ctl("audit")
	if code != 0 || !strings.Contains(out, "stranded: pod default/stuck's sandbox "+stuck.ContainerID[:13]+" is NotReady") ||
		!strings.Contains(out, "a chained plugin's teardown probably failed") {
		t.Errorf("audit: exit %d; want the stranded lease explained with its cause", code)
	}

	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`ipledger_releases_total{reason="reconcile-gone"} 1` + "\n", `ipledger_releases_total{reason="DEL"} 0` + "\n", "ipledger_leases_stranded 1\n", "ipledger_runtime_up 1\n", `ipledger_books_balance{network="ops"} 0` + "\n", `ipledger_leases_live{network="ops"} 2` + "\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if !regexp.MustCompile(`ipledger_reconcile_rounds_total\{outcome="ok"\} [1-9]`).Match(body) {
		t.Error("no reconcile round counted ok")
	}

	dom := chromium.DumpDOM(t, "http://"+metrics+"/")
	states := map[string]string{}
	for _, c := range chromium.PoolCells(dom)[network] {
		states[c.IP] = c.State
	}
	if states[addrOf(stuck)] != "stranded" || states[addrOf(web)] != "live" {
		t.Errorf("pool page: %s is %q, want stranded; %s is %q, want live", addrOf(stuck), states[addrOf(stuck)], addrOf(web), states[addrOf(web)])
	}
	chromium.Screenshot(t, "http://"+metrics+"/", filepath.Join(t.ArtifactDir(), "pool-page-runtime.png"))
	t.Logf("screenshot: %s", filepath.Join(t.ArtifactDir(), "pool-page-runtime.png"))

	out, code = w.ctl("doctor", "--netns", "/proc/self/ns/net")
	if !regexp.MustCompile(`(?m)^OK   runtime reachable: containerd v?[0-9]+\.[0-9]+\.`).MatchString(out) || !strings.Contains(out, "OK   no NotReady sandbox older than 1h0m0s") {
		t.Errorf("doctor: exit %d; want the runtime and its version", code)
	}

	// release asks the runtime: the READY pod's lease is kept unless forced
	out, code = w.ctl("release", "--network", network, "--container-id", webID, "--reason", "test")
	if code != 2 || !strings.Contains(out, "READY") || !strings.Contains(out, "--force-release-ready-sandbox") {
		t.Fatalf("release of a READY sandbox's lease: exit %d; want 2, refused, naming the flag", code)
	}
	if _, held := leaseOf(w.leases(), webID); !held {
		t.Fatal("the refused release released the lease")
	}
	if _, code = w.ctl("release", "--network", network, "--container-id", stuck.ContainerID, "--reason", "stuck pod"); code != 0 {
		t.Fatalf("release of a NOTREADY sandbox's lease: exit %d", code)
	}
	if _, code = w.ctl("release", "--network", network, "--container-id", webID, "--reason", "forced", "--force-release-ready-sandbox"); code != 0 {
		t.Fatalf("forced release: exit %d", code)
	}
	for _, v := range []api.LeaseView{stuck, web} {
		h := w.history(network, addrOf(v))
		if len(h) == 0 || h[len(h)-1].Reason != string(ledger.ReasonManual) {
			t.Errorf("history of %s: %+v; want a manual release", addrOf(v), h)
		}
	}
	w.setConf(w.conflist(network, w.ipledgerIPAM(), false))
	sbs, err := w.c.ListSandboxes(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sbs {
		w.stopRemove(s.ID)
	}
}

func leaseOf(ls []api.LeaseView, cid string) (api.LeaseView, bool) {
	for _, v := range ls {
		if v.ContainerID == cid {
			return v, true
		}
	}
	return api.LeaseView{}, false
}
