package ctl

import (
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/api"
)

// Explanation is one finding of the audit in plain words.
type Explanation struct {
	// Kind: leaked, stranded, suspect, two-leases, double-assigned, runtime, books.
	Kind string `json:"kind"`
	// Network, ContainerID, IfName and IPs name the lease, when it is about one.
	Network     string   `json:"network,omitempty"`
	ContainerID string   `json:"containerID,omitempty"`
	IfName      string   `json:"ifname,omitempty"`
	IPs         []string `json:"ips,omitempty"`
	Pod         string   `json:"pod,omitempty"`
	// Text says what is wrong, its likely cause and what happens next or what to do.
	Text string `json:"text"`
}

// auditOutput is `audit -o json|yaml`: the agent's audit (the contract's fields at
// the top level) and the explanations.
type auditOutput struct {
	*api.Audit
	Explanations []Explanation `json:"explanations"`
}

func audit(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	out := outputFlag(fs)
	if !parseFlags(env, fs, args, out) {
		return ExitError
	}
	a, err := fetchAudit(env, socket)
	if err != nil {
		return fail(env, err)
	}
	ls, err := fetchLeases(env, socket, "")
	if err != nil {
		fmt.Fprintln(env.Stderr, "ipledgerctl: audit: leases could not be read, explanations limited:", err)
	}
	ex := Explain(a, ls, env.now())
	if !printStructured(env, *out, auditOutput{Audit: a, Explanations: ex}) {
		verdict := "BALANCED"
		if !a.OK {
			verdict = "NOT BALANCED"
		}
		fmt.Fprintf(env.Stdout, "%s: live %d, suspect %d, stranded %d, leaked %d, double-assigned %d (runtime: %s)\n", verdict, a.Live, a.Suspect, a.Stranded, a.Leaked, a.DoubleAssigned, a.Runtime)
		for _, p := range a.Pools {
			fmt.Fprintf(env.Stdout, "  %s\n", PoolBooks(p))
		}
		for _, e := range ex {
			fmt.Fprintf(env.Stdout, "  %s\n", e.Text)
		}
	}
	if !a.OK {
		return ExitUnbalanced
	}
	return ExitOK
}

// Explain turns an audit and the live leases into plain-word findings, each with its
// likely cause: leaked, stranded and suspect leases (the reconciler's verdicts), pods
// holding more than one lease, doubly assigned addresses, an unreachable runtime and
// unbalanced books.
func Explain(a *api.Audit, leases []api.LeaseView, now time.Time) []Explanation {
	ex := []Explanation{}
	byKey := map[string]api.LeaseView{}
	for _, l := range leases {
		byKey[l.Network+"/"+l.ContainerID+"/"+l.IfName] = l
	}
	seen := map[string]bool{}
	explainLease := func(l api.LeaseView) {
		k := l.Network + "/" + l.ContainerID + "/" + l.IfName
		if seen[k] {
			return
		}
		seen[k] = true
		if full, ok := byKey[k]; ok {
			l = full
		}
		kind := l.Verdict
		if kind == "" {
			switch {
			case strings.HasPrefix(l.Suspect, "stranded"):
				kind = api.VerdictStranded
			case l.Suspect != "":
				kind = api.VerdictSuspect
			default:
				return
			}
		}
		who := "an attachment without pod metadata"
		if l.Name != "" {
			who = "pod " + l.Namespace + "/" + l.Name
		}
		addr := strings.Join(l.IPs, ", ")
		age := Age(now.Sub(l.Created))
		sb := short(l.ContainerID)
		var text string
		switch kind {
		case api.VerdictLeaked:
			if l.Sandbox == "NOTREADY" {
				text = fmt.Sprintf("leaked: %s's sandbox %s is NotReady and its namespace no longer holds %s (lease %s old) — the pod was torn down but no DEL reached ipledger; the reconciler releases it after the release grace", who, sb, addr, age)
			} else {
				text = fmt.Sprintf("leaked: %s's sandbox %s is gone from the runtime and its namespace no longer holds %s (lease %s old) — the runtime removed the sandbox without a DEL that reached ipledger (a lost DEL, or a DEL without CNI_NETNS to a plugin that needed it); the reconciler releases it after the release grace", who, sb, addr, age)
			}
		case api.VerdictStranded:
			state := "NotReady"
			if l.Sandbox == "GONE" {
				state = "gone from the runtime"
			}
			text = fmt.Sprintf("stranded: %s's sandbox %s is %s (lease %s old) and its namespace still holds %s — a chained plugin's teardown probably failed and the runtime swallowed the error; kept so the address is never given to a second pod. Fix: delete the pod (or its sandbox), or run ipledgerd with --reclaim-stranded", who, sb, state, age, addr)
		default:
			why, fix := "no network namespace was recorded at ADD", "delete the pod if it is not running"
			if strings.Contains(l.Suspect, "netns directory not visible") {
				why, fix = "the agent cannot see its network namespace and nothing shows it gone", "mount the runtime's netns directory (the host's /run/netns or /var/run/netns) into the agent with mountPropagation: HostToContainer (ipledgerctl doctor names it)"
			}
			text = fmt.Sprintf("suspect: %s's sandbox %s is %s and %s, so nothing can verify whether %s is still configured; kept. Fix: %s", who, sb, strings.ToLower(orDash(l.Sandbox)), why, addr, fix)
		}
		if l.Suspect != "" {
			text += " [evidence: " + l.Suspect + "]"
		}
		ex = append(ex, Explanation{Kind: kind, Network: l.Network, ContainerID: l.ContainerID, IfName: l.IfName, IPs: l.IPs, Pod: podName(l), Text: text})
	}
	for _, l := range a.SuspectLeases {
		explainLease(l)
	}
	for _, l := range leases {
		explainLease(l)
	}
	// a pod holding more than one lease on one network and interface
	type podKey struct{ network, uid, ifname string }
	byPod := map[podKey][]api.LeaseView{}
	for _, l := range leases {
		if l.UID != "" {
			k := podKey{l.Network, l.UID, l.IfName}
			byPod[k] = append(byPod[k], l)
		}
	}
	keys := make([]podKey, 0, len(byPod))
	for k, ls := range byPod {
		if len(ls) > 1 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
	for _, k := range keys {
		ls := byPod[k]
		sort.Slice(ls, func(i, j int) bool { return ls[i].Created.Before(ls[j].Created) })
		var held []string
		for _, l := range ls {
			held = append(held, fmt.Sprintf("%s since %s (sandbox %s, %s)", strings.Join(l.IPs, ","), Age(now.Sub(l.Created)), short(l.ContainerID), strings.ToLower(orDash(l.Sandbox))))
		}
		n := "two"
		if len(ls) > 2 {
			n = fmt.Sprint(len(ls))
		}
		ex = append(ex, Explanation{Kind: "two-leases", Network: k.network, IfName: k.ifname, Pod: podName(ls[0]),
			Text: fmt.Sprintf("pod %s holds %s leases on %s: %s — its sandbox was re-created without a DEL for the old one; the old lease is released once the runtime confirms its sandbox is not READY", podName(ls[0]), n, k.network, strings.Join(held, "; "))})
	}
	for _, d := range a.Doubles {
		var hs []string
		for _, h := range d.Holders {
			hs = append(hs, h.String())
		}
		ex = append(ex, Explanation{Kind: "double-assigned", Network: d.Network, IPs: []string{d.IP.String()},
			Text: fmt.Sprintf("double-assigned: %s/%s is held by %s — the ledger's books are broken, which its design rules out; keep the state file and report it with `ipledgerctl history --network %s --ip %s`", d.Network, d.IP, strings.Join(hs, " and "), d.Network, d.IP)})
	}
	if a.Runtime == "unreachable" {
		ex = append(ex, Explanation{Kind: "runtime", Text: "runtime unreachable: the agent cannot ask the container runtime about sandboxes, so nothing is released by reconciliation until it answers (when in doubt, keep). Fix: check the runtime (systemctl status containerd) and ipledgerd's --cri-endpoint"})
	}
	for _, p := range a.Problems {
		ex = append(ex, Explanation{Kind: "books", Text: "books: " + p})
	}
	return ex
}

// PoolBooks is one pool's line of an audit: its allocations against releases and
// live leases, and its free addresses.
func PoolBooks(p api.PoolAudit) string {
	return fmt.Sprintf("pool %s: %d allocations = %d releases + %d live; %d free", p.Network, p.Allocations, p.Releases, p.Live, p.Free)
}
