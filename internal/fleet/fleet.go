// Package fleet is kubectl-ipledger, the kubectl plugin: it runs one ipledgerctl
// command (leases, audit, doctor, blocks) in every node's agent pod through the API
// server's pods/exec, as kubectl exec does, so the user's RBAC decides what it may
// read, and prints the nodes' answers as one table, or one list for -o json|yaml,
// with the node beside each.
package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/ipledger/ipledger/internal/ctl"
)

// Exit statuses. When several apply, the highest is the exit status. The first
// three are ipledgerctl's meanings, per node; the plugin's own failure has a status of
// its own, so that a script tells "a node's doctor FAILs" (2) from "the plugin could
// not run" (4).
const (
	ExitOK = ctl.ExitOK
	// ExitUnbalanced: audit: a node's books do not balance, or its runtime is
	// unreachable (nothing reconciles its leases); doctor: the worst check of any
	// node is WARN.
	ExitUnbalanced = ctl.ExitUnbalanced
	// ExitError: doctor: a check of some node FAILed (ipledgerctl doctor's 2).
	ExitError = ctl.ExitError
	// ExitUnreachable: a node's agent could not be asked (no pod of the agents'
	// DaemonSet, exec refused or failed, ipledgerctl gave no answer); stderr names
	// the node and why.
	ExitUnreachable = 3
	// ExitPlugin: the plugin itself failed: usage, the kubeconfig, the agent pods
	// or their DaemonSet could not be read, an answer could not be printed.
	ExitPlugin = 4
)

// AgentCtl is ipledgerctl's path in the ipledger image (internal/image's BinDir). Its
// default --socket, /run/ipledger/ipledger.sock, is the one the DaemonSet's agent
// serves (deploy/ipledger.yaml mounts the host's /run/ipledger there).
const AgentCtl = "/usr/local/bin/ipledgerctl"

// The defaults of the flags that find the agents: deploy/ipledger.yaml's DaemonSet.
const (
	DefaultNamespace = "ipledger"
	DefaultSelector  = "app=ipledgerd"
	DefaultContainer = "ipledgerd"
	DefaultDaemonSet = "ipledgerd"
)

// Pod is an agent pod as the API shows it.
type Pod struct {
	Name     string
	Node     string // spec.nodeName; empty while unscheduled
	Phase    string // status.phase
	Created  time.Time
	Deleting bool  // a deletionTimestamp is set
	Owner    Owner // its controller owner reference; zero when it has none
}

// Owner is a controller owner reference.
type Owner struct {
	APIVersion, Kind, Name, UID string
}

func (o Owner) String() string {
	if o.Kind == "" {
		return "no controller"
	}
	return fmt.Sprintf("%s %s (uid %s)", o.Kind, o.Name, o.UID)
}

// Lister reads the cluster through the API server. An error the API's authorization
// refused wraps ErrForbidden.
type Lister interface {
	// Nodes returns the names of the cluster's Nodes.
	Nodes(ctx context.Context) ([]string, error)
	// Pods returns namespace's pods that match the label selector.
	Pods(ctx context.Context, namespace, selector string) ([]Pod, error)
	// DaemonSetUID returns the UID of the DaemonSet (apps/v1) name in namespace; an
	// error wrapping ErrNoDaemonSet when there is none.
	DaemonSetUID(ctx context.Context, namespace, name string) (string, error)
}

// Exec runs cmd in a container of a pod as kubectl exec does (the API server's
// pods/exec subresource), without stdin or a terminal. exit is cmd's exit status
// when it ran; err is non-nil when it could not be run (exit is then meaningless)
// and wraps ErrForbidden when the API's authorization refused the exec.
type Exec interface {
	Exec(ctx context.Context, namespace, pod, container string, cmd []string) (stdout, stderr []byte, exit int, err error)
}

// Client is the cluster a kubeconfig names.
type Client struct {
	Lister Lister
	Exec   Exec
}

// Env is the plugin's process edges.
type Env struct {
	Stdout, Stderr io.Writer
	// Connect makes the client of the kubeconfig that the flags and KUBECONFIG
	// name, as kubectl loads it (Connect).
	Connect func(clientcmd.ClientConfig) (*Client, error)
	// Now is the wall clock (lease ages); default time.Now.
	Now func() time.Time
}

// Node statuses in NodeResult.Status.
const (
	StatusOK          = "ok"
	StatusUnbalanced  = "unbalanced"  // audit: the node's books do not balance
	StatusNoRuntime   = "no-runtime"  // audit: the node's runtime is unreachable: nothing reconciles there
	StatusWarn        = "warn"        // doctor: the worst check is WARN
	StatusFail        = "fail"        // doctor: a check FAILed
	StatusUnreachable = "unreachable" // the node's agent could not be asked; Error says why
)

// NodeResult is one node's entry of -o json|yaml.
type NodeResult struct {
	Node   string `json:"node"`
	Pod    string `json:"pod,omitempty"`
	Status string `json:"status"`
	// Result is the agent's answer: what `ipledgerctl COMMAND -o json` printed in
	// the node's agent pod.
	Result json.RawMessage `json:"result,omitempty"`
	// Error is why the node could not be asked (Status unreachable).
	Error string `json:"error,omitempty"`

	err    error
	stderr []byte // ipledgerctl's warnings on an answer
}

// exit is the node's share of the exit status.
func (r *NodeResult) exit() int {
	switch r.Status {
	case StatusOK:
		return ExitOK
	case StatusUnbalanced, StatusNoRuntime, StatusWarn:
		return ExitUnbalanced
	case StatusFail:
		return ExitError
	}
	return ExitUnreachable
}

// Options are the command line's.
type Options struct {
	Command   string // leases, audit, doctor, blocks
	Output    string // table, json, yaml
	Node      string // only this node
	Namespace string // the agents' namespace
	Selector  string // the agents' label selector
	Container string // the agent's container
	DaemonSet string // the agents' DaemonSet: only its pods are asked
	Network   string // leases, blocks: only this network
	Pod       string // leases: only this pod
	Timeout   time.Duration
}

const usage = `kubectl ipledger: ipledgerctl on every node of the cluster, through the API server.

usage: kubectl ipledger COMMAND [flags]

commands:
  leases   every node's live leases (--network NAME, --pod [NAMESPACE/]NAME|UID)
  audit    every node's books; exit 1 when a node's do not balance or its runtime is unreachable
  doctor   every node's checks; exit 1 when the worst is WARN, 2 when a check FAILs
  blocks   cluster mode: the address blocks, each under the node that owns it (--network NAME)

It execs ` + AgentCtl + ` COMMAND -o json in each node's agent pod, the pods
the agents' DaemonSet owns (as kubectl exec does: the user needs list on pods,
get on daemonsets and create on pods/exec in the agents' namespace, and list on
nodes to see nodes without an agent). A node whose agent cannot be asked is named
on stderr and makes the exit status 3; the plugin's own failure (usage, kubeconfig,
the pods or the DaemonSet not read) exits 4. The highest status found wins.

flags:
`

// Main runs the plugin and returns the exit status.
func Main(env *Env, args []string) int {
	o, cfg, code, ok := parse(env, args)
	if !ok {
		return code
	}
	client, err := env.Connect(cfg)
	if err != nil {
		fmt.Fprintln(env.Stderr, "kubectl-ipledger:", err)
		return ExitPlugin
	}
	results, err := Gather(context.Background(), client, o, env.Stderr)
	if err != nil {
		fmt.Fprintln(env.Stderr, "kubectl-ipledger:", err)
		return ExitPlugin
	}
	now := time.Now
	if env.Now != nil {
		now = env.Now
	}
	if err := Print(env.Stdout, o, results, now()); err != nil {
		fmt.Fprintln(env.Stderr, "kubectl-ipledger:", err)
		return ExitPlugin
	}
	code = ExitOK
	for i := range results {
		r := &results[i]
		for _, line := range strings.Split(strings.TrimSpace(string(r.stderr)), "\n") {
			if line != "" {
				fmt.Fprintf(env.Stderr, "kubectl-ipledger: node %s: %s\n", r.Node, line)
			}
		}
		if r.err != nil {
			fmt.Fprintf(env.Stderr, "kubectl-ipledger: node %s: %s\n", r.Node, r.Error)
		}
		if r.Status == StatusNoRuntime {
			fmt.Fprintf(env.Stderr, "kubectl-ipledger: node %s: the agent cannot reach the container runtime: nothing is reconciled there until it answers; check the runtime and ipledgerd's --cri-endpoint\n", r.Node)
		}
		code = max(code, r.exit())
	}
	if len(results) == 0 {
		fmt.Fprintf(env.Stderr, "kubectl-ipledger: no nodes and no agent pods (namespace %s, selector %s)\n", o.Namespace, o.Selector)
		code = ExitUnreachable
	}
	return code
}

// parse reads the command line: the command, this plugin's flags and kubectl's
// kubeconfig flags (--kubeconfig, --context, --as, ... except -n/--namespace, which
// names the agents' namespace here).
func parse(env *Env, args []string) (Options, clientcmd.ClientConfig, int, bool) {
	o := Options{}
	fs := pflag.NewFlagSet("kubectl-ipledger", pflag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.StringVarP(&o.Output, "output", "o", "table", "output: table, json or yaml")
	fs.StringVar(&o.Node, "node", "", "only this node")
	fs.StringVarP(&o.Namespace, "namespace", "n", DefaultNamespace, "the agents' namespace")
	fs.StringVarP(&o.Selector, "selector", "l", DefaultSelector, "the agent pods' label selector")
	fs.StringVarP(&o.Container, "container", "c", DefaultContainer, "the agent's container in its pod")
	fs.StringVar(&o.DaemonSet, "daemonset", DefaultDaemonSet, "the agents' DaemonSet: only the pods it owns are asked")
	fs.StringVar(&o.Network, "network", "", "leases, blocks: only this network")
	fs.StringVar(&o.Pod, "pod", "", "leases: only this pod: NAMESPACE/NAME, NAME or its UID")
	fs.DurationVar(&o.Timeout, "timeout", time.Minute, "how long to wait for each node's answer")
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	fs.StringVar(&rules.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "path to the kubeconfig file (default $KUBECONFIG, else ~/.kube/config)")
	overrides := &clientcmd.ConfigOverrides{}
	names := clientcmd.RecommendedConfigOverrideFlags("")
	names.ContextOverrideFlags.Namespace = clientcmd.FlagInfo{}
	clientcmd.BindOverrideFlags(overrides, fs, names)
	fs.Usage = func() {
		fmt.Fprint(env.Stderr, usage)
		fmt.Fprint(env.Stderr, fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return o, nil, ExitOK, false
		}
		fmt.Fprintf(env.Stderr, "kubectl-ipledger: %v (see kubectl ipledger --help)\n", err)
		return o, nil, ExitPlugin, false
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return o, nil, ExitPlugin, false
	}
	if fs.NArg() > 1 {
		fmt.Fprintf(env.Stderr, "kubectl-ipledger: unexpected arguments %q\n", fs.Args()[1:])
		return o, nil, ExitPlugin, false
	}
	o.Command = fs.Arg(0)
	switch o.Command {
	case "leases", "audit", "doctor", "blocks":
	default:
		fmt.Fprintf(env.Stderr, "kubectl-ipledger: unknown command %q: use leases, audit, doctor or blocks\n", o.Command)
		return o, nil, ExitPlugin, false
	}
	switch o.Output {
	case "table", "json", "yaml":
	default:
		fmt.Fprintf(env.Stderr, "kubectl-ipledger: -o %q: use table, json or yaml\n", o.Output)
		return o, nil, ExitPlugin, false
	}
	if o.Network != "" && o.Command != "leases" && o.Command != "blocks" {
		fmt.Fprintf(env.Stderr, "kubectl-ipledger: --network is for leases and blocks\n")
		return o, nil, ExitPlugin, false
	}
	if o.Pod != "" && o.Command != "leases" {
		fmt.Fprintf(env.Stderr, "kubectl-ipledger: --pod is for leases\n")
		return o, nil, ExitPlugin, false
	}
	return o, clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides), ExitOK, true
}

// AgentCommand is what runs in each agent pod for o.
func AgentCommand(o Options) []string {
	cmd := []string{AgentCtl, o.Command, "-o", "json"}
	if o.Network != "" {
		cmd = append(cmd, "--network", o.Network)
	}
	if o.Pod != "" {
		cmd = append(cmd, "--pod", o.Pod)
	}
	return cmd
}

// parallel is how many nodes are asked at once.
const parallel = 8

// Gather finds each node's agent pod and runs o's command in it, a result per node
// sorted by node name: the nodes the API lists (all of them, or o.Node) and any other
// node an agent pod runs on. The error is for a cluster that could not be read at
// all (the agent pods not listed); a node that could not be asked is its result's.
// warn gets what the user should know that is no node's (the Nodes not listed).
func Gather(ctx context.Context, c *Client, o Options, warn io.Writer) ([]NodeResult, error) {
	pods, err := c.Lister.Pods(ctx, o.Namespace, o.Selector)
	if err != nil {
		if errors.Is(err, ErrForbidden) {
			return nil, fmt.Errorf("listing the agent pods needs list on pods in namespace %s (RBAC): %w", o.Namespace, err)
		}
		return nil, fmt.Errorf("listing the agent pods (namespace %s, selector %s): %w", o.Namespace, o.Selector, err)
	}
	names := map[string]bool{}
	uid, err := c.Lister.DaemonSetUID(ctx, o.Namespace, o.DaemonSet)
	if err != nil {
		if errors.Is(err, ErrForbidden) {
			return nil, fmt.Errorf("reading the agents' DaemonSet %s/%s needs get on daemonsets (apps) in namespace %s (RBAC): %w", o.Namespace, o.DaemonSet, o.Namespace, err)
		}
		if errors.Is(err, ErrNoDaemonSet) {
			return nil, fmt.Errorf("no DaemonSet %s/%s: is ipledger installed (deploy/ipledger.yaml)? --daemonset and -n name another: %w", o.Namespace, o.DaemonSet, err)
		}
		return nil, fmt.Errorf("reading the agents' DaemonSet %s/%s: %w", o.Namespace, o.DaemonSet, err)
	}
	byNode := map[string]Pod{}
	strangers := map[string][]Pod{} // by node: pods of the selector the DaemonSet does not own
	for _, p := range pods {
		if p.Node == "" {
			continue
		}
		if !ownedBy(p, o.DaemonSet, uid) {
			strangers[p.Node] = append(strangers[p.Node], p)
			continue
		}
		if cur, ok := byNode[p.Node]; !ok || better(p, cur) {
			byNode[p.Node] = p
		}
	}
	for n := range strangers {
		names[n] = true
	}
	nodes, err := c.Lister.Nodes(ctx)
	switch {
	case err != nil && o.Node == "":
		fmt.Fprintf(warn, "kubectl-ipledger: the Nodes could not be listed, so a node without an agent pod is not shown (%v)\n", err)
	case err == nil:
		for _, n := range nodes {
			names[n] = true
		}
	}
	for n := range byNode {
		names[n] = true
	}
	if o.Node != "" {
		if err == nil && !names[o.Node] {
			return []NodeResult{{Node: o.Node, Status: StatusUnreachable, err: fmt.Errorf("no node %s", o.Node), Error: "no node " + o.Node}}, nil
		}
		names = map[string]bool{o.Node: true}
	}
	for n := range names {
		if _, ok := byNode[n]; ok {
			for _, p := range strangers[n] {
				fmt.Fprintf(warn, "kubectl-ipledger: pod %s/%s on node %s matches %s but its owner is %s, not DaemonSet %s (uid %s): not asked\n",
					o.Namespace, p.Name, n, o.Selector, p.Owner, o.DaemonSet, uid)
			}
		}
	}
	results := make([]NodeResult, 0, len(names))
	for n := range names {
		results = append(results, NodeResult{Node: n})
	}
	sort.Slice(results, func(i, j int) bool { return results[i].Node < results[j].Node })
	cmd := AgentCommand(o)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range results {
		r := &results[i]
		p, ok := byNode[r.Node]
		switch {
		case !ok && len(strangers[r.Node]) > 0:
			r.Pod = strangers[r.Node][0].Name
			r.setErr(fmt.Errorf("%w on node %s: pod %s/%s matches %s but its owner is %s, not DaemonSet %s; its answers are not trusted", ErrNotDaemonSetPod, r.Node, o.Namespace, r.Pod, o.Selector, strangers[r.Node][0].Owner, o.DaemonSet))
			continue
		case !ok:
			r.setErr(fmt.Errorf("%w on node %s (namespace %s, selector %s): is the DaemonSet installed, and does it tolerate the node's taints?", ErrNoAgentPod, r.Node, o.Namespace, o.Selector))
			continue
		case p.Phase != "Running" || p.Deleting:
			r.Pod = p.Name
			phase := p.Phase
			if p.Deleting {
				phase += ", being deleted"
			}
			r.setErr(fmt.Errorf("%w: pod %s/%s is %s", ErrAgentNotRunning, o.Namespace, p.Name, phase))
			continue
		}
		r.Pod = p.Name
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(ctx, o.Timeout)
			defer cancel()
			ask(ctx, c.Exec, o, cmd, r)
		})
	}
	wg.Wait()
	return results, nil
}

// ownedBy: p's controller is the DaemonSet name (apps/v1) of that uid.
func ownedBy(p Pod, name, uid string) bool {
	o := p.Owner
	return o.APIVersion == "apps/v1" && o.Kind == "DaemonSet" && o.Name == name && o.UID == uid && uid != ""
}

// better: the pod to ask when a node has two (a DaemonSet's rolling update): a
// running one over one that is not, then the newer.
func better(p, than Pod) bool {
	run := func(p Pod) bool { return p.Phase == "Running" && !p.Deleting }
	if run(p) != run(than) {
		return run(p)
	}
	return p.Created.After(than.Created)
}

func (r *NodeResult) setErr(err error) {
	r.Status, r.err, r.Error = StatusUnreachable, err, err.Error()
}

// ask runs cmd in r's pod and files the answer in r.
func ask(ctx context.Context, ex Exec, o Options, cmd []string, r *NodeResult) {
	stdout, stderr, exit, err := ex.Exec(ctx, o.Namespace, r.Pod, o.Container, cmd)
	if err != nil {
		if errors.Is(err, ErrForbidden) {
			r.setErr(fmt.Errorf("exec in pod %s/%s refused: it needs create on pods/exec in namespace %s (RBAC): %w", o.Namespace, r.Pod, o.Namespace, err))
		} else {
			r.setErr(fmt.Errorf("exec in pod %s/%s: %w", o.Namespace, r.Pod, err))
		}
		return
	}
	out := bytes.TrimSpace(stdout)
	status := ""
	switch {
	case len(out) == 0 || !json.Valid(out):
	case exit == ctl.ExitOK && o.Command == "audit" && runtimeUnreachable(out):
		status = StatusNoRuntime
	case exit == ctl.ExitOK:
		status = StatusOK
	case exit == ctl.ExitUnbalanced && o.Command == "audit":
		status = StatusUnbalanced
	case exit == ctl.ExitUnbalanced && o.Command == "doctor":
		status = StatusWarn
	case exit == ctl.ExitError && o.Command == "doctor":
		status = StatusFail
	}
	if status == "" {
		msg := strings.TrimSpace(string(stderr))
		if msg == "" {
			msg = "no output"
		}
		r.setErr(fmt.Errorf("%w: %s in pod %s/%s exited %d: %s", ErrNoAnswer, strings.Join(cmd, " "), o.Namespace, r.Pod, exit, msg))
		return
	}
	r.Status, r.Result, r.stderr = status, json.RawMessage(out), stderr
}

// runtimeUnreachable: an audit answer whose runtime is unreachable.
func runtimeUnreachable(answer []byte) bool {
	var a struct {
		Runtime string `json:"runtime"`
	}
	return json.Unmarshal(answer, &a) == nil && a.Runtime == "unreachable"
}

// Print writes the results as o.Output says: a table with the NODE column first, or
// the list of results as JSON or YAML.
func Print(w io.Writer, o Options, results []NodeResult, now time.Time) error {
	switch o.Output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	case "yaml":
		b, err := yaml.Marshal(results)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	switch o.Command {
	case "leases":
		return leasesTable(w, results, now)
	case "audit":
		return auditTable(w, results)
	case "doctor":
		return doctorTable(w, results)
	case "blocks":
		return blocksTable(w, results)
	}
	return fmt.Errorf("unknown command %q", o.Command)
}
