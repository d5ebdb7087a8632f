package ctl

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ipledger/ipledger/internal/api"
)

func leases(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("leases", flag.ContinueOnError)
	out := outputFlag(fs)
	network := fs.String("network", "", "only this network")
	pod := fs.String("pod", "", "only this pod: NAMESPACE/NAME, NAME (any namespace) or its UID")
	if !parseFlags(env, fs, args, out) {
		return ExitError
	}
	ls, err := fetchLeases(env, socket, *network)
	if err != nil {
		return fail(env, err)
	}
	if *pod != "" {
		kept := []api.LeaseView{}
		for _, l := range ls {
			if podMatches(l, *pod) {
				kept = append(kept, l)
			}
		}
		ls = kept
	}
	if printStructured(env, *out, ls) {
		return ExitOK
	}
	now := env.now()
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, LeaseHeader)
	for _, l := range ls {
		fmt.Fprintln(tw, LeaseRow(l, now))
	}
	tw.Flush()
	return ExitOK
}

// LeaseHeader is the leases table's header, its columns separated by tabs.
const LeaseHeader = "NETWORK\tCONTAINER\tIFNAME\tIPS\tPOD\tPHASE\tAGE\tSANDBOX\tVERDICT\tWHY"

// LeaseRow is l's row of the leases table (columns separated by tabs, as
// LeaseHeader's), its age at now.
func LeaseRow(l api.LeaseView, now time.Time) string {
	v := l.Verdict
	if v == "" {
		v = "-"
	}
	if l.Suspect != "" {
		v += " (" + l.Suspect + ")"
	}
	if l.Lost {
		// cluster mode: another node owns the address's block now
		v += " (block " + l.Block + " lost)"
	}
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", l.Network, short(l.ContainerID), l.IfName, strings.Join(l.IPs, ","), podName(l), podPhase(l), Age(now.Sub(l.Created)), orDash(l.Sandbox), v, orDash(l.Why))
}

func fetchLeases(env *Env, socket, network string) ([]api.LeaseView, error) {
	resp, err := call(env, socket, api.Request{Op: api.OpLeases, Network: network})
	if err != nil {
		return nil, err
	}
	if resp.Leases == nil {
		return []api.LeaseView{}, nil
	}
	return resp.Leases, nil
}

// podMatches: NAMESPACE/NAME, NAME in any namespace, or the pod's UID.
func podMatches(l api.LeaseView, want string) bool {
	if ns, name, ok := strings.Cut(want, "/"); ok {
		return l.Namespace == ns && l.Name == name
	}
	return l.Name == want || (l.UID != "" && l.UID == want)
}

func podName(l api.LeaseView) string {
	if l.Name == "" {
		return "-"
	}
	return l.Namespace + "/" + l.Name
}

// podPhase is the pod as the Kubernetes API shows it: its phase, "deleted" when the
// API has no such pod, "-" when the agent cannot tell (no --node-name, its pod
// watch has not listed yet, or no pod recorded).
func podPhase(l api.LeaseView) string {
	if l.PodInAPI == api.PodInAPINo {
		return "deleted"
	}
	return orDash(l.PodPhase)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Age prints a duration as kubectl does: 42s, 5m, 3h, 3h12m under ten hours, 4d.
func Age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 10*time.Hour:
		h := int(d.Hours())
		if m := int(d.Minutes()) % 60; m > 0 {
			return fmt.Sprintf("%dh%dm", h, m)
		}
		return fmt.Sprintf("%dh", h)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func release(env *Env, socket string, args []string) int {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	network := fs.String("network", "", "network name (required)")
	cid := fs.String("container-id", "", "container (sandbox) ID (required)")
	ifname := fs.String("ifname", "eth0", "interface name")
	reason := fs.String("reason", "", "why, recorded in the address's history")
	force := fs.Bool("force-release-ready-sandbox", false, "release even when the runtime reports the sandbox READY (its pod still uses the address) or cannot be asked")
	if !parseFlags(env, fs, args, nil) {
		return ExitError
	}
	if *network == "" || *cid == "" {
		return fail(env, errors.New("release: --network and --container-id are required"))
	}
	if _, err := call(env, socket, api.Request{Op: api.OpRelease, Network: *network, ContainerID: *cid, IfName: *ifname, Detail: *reason, ForceReadySandbox: *force}); err != nil {
		return fail(env, err)
	}
	fmt.Fprintf(env.Stdout, "released %s/%s/%s\n", *network, *cid, *ifname)
	return ExitOK
}
