// Package api is the request/response protocol between the plugins, the CLI and the
// node agent: one JSON request and one JSON response per connection on a unix socket.
// Every message carries the protocol version; the agent refuses versions it does not
// speak.
package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/ipledger/ipledger/internal/pool"
)

// Version is the protocol version this code speaks.
const Version = 1

// Bounds on messages.
const (
	// MaxRequest bounds a request line. Real requests are small: an ADD is under
	// 2 KiB (its ranges are bounded by MaxRanges, pod fields by the ledger's limits);
	// the largest is a GC, about 100 bytes per valid attachment, so 256 KiB carries
	// some 2,500 attachments, ten times the most pods a node is run with. The agent
	// holds at most one request per connection slot in memory, so the bound also
	// bounds what clients can make it buffer.
	MaxRequest = 256 << 10
	// MaxResponse bounds an answer line (a lease listing of a large node); answers
	// come from the agent, which the client trusts.
	MaxResponse = 16 << 20
	// MaxRanges bounds the ranges (over all range sets) of one network: a pool is a
	// handful of ranges in practice, and the agent checks them under its ledger lock.
	MaxRanges = 64
)

// ErrRequestTooLarge: a request longer than MaxRequest; the agent refuses it.
var ErrRequestTooLarge = errors.New("request too large")

// CountRanges is the number of ranges over all of sets.
func CountRanges(sets []pool.RangeSet) int {
	n := 0
	for _, s := range sets {
		n += len(s)
	}
	return n
}

// Operations.
const (
	OpAdd     = "add"
	OpDel     = "del"
	OpCheck   = "check"
	OpGC      = "gc"
	OpStatus  = "status"
	OpLeases  = "leases"
	OpAudit   = "audit"
	OpHistory = "history"
	OpRelease = "release"
	OpPing    = "ping"
	OpDoctor  = "doctor"
	// OpBlocks: cluster mode's view, this node's name and the datastore's blocks
	// (Response.Cluster).
	OpBlocks = "blocks"
	// OpCNI: one whole call of the ipledger IPAM plugin, its environment and stdin
	// (Request.CNI), run by the agent as the plugin would run it; the answer is what
	// the plugin would print and its exit status (Response.CNI). An agent that answers
	// anything else (an error, an older agent's unknown op) leaves the call to the
	// caller, which execs the plugin. Why: ipam.Forward.
	OpCNI = "cni"
)

// CNICall is one CNI call as the runtime made it: the CNI_* variables, stdin, and
// what only the plugin's process can see.
type CNICall struct {
	Command       string `json:"command"`                 // CNI_COMMAND
	ContainerID   string `json:"containerID,omitempty"`   // CNI_CONTAINERID
	NetNS         string `json:"netns,omitempty"`         // CNI_NETNS
	IfName        string `json:"ifname,omitempty"`        // CNI_IFNAME
	Args          string `json:"args,omitempty"`          // CNI_ARGS
	Path          string `json:"path,omitempty"`          // CNI_PATH
	NetNSOverride string `json:"netnsOverride,omitempty"` // CNI_NETNS_OVERRIDE
	Stdin         []byte `json:"stdin"`
	// NetNSID and SelfNetNS are the identities of CNI_NETNS and of the plugin's own
	// network namespace, read by the plugin (the agent may run in a container that
	// sees neither path).
	NetNSID   NetNS `json:"netnsID,omitzero"`
	SelfNetNS NetNS `json:"selfNetNS,omitzero"`
}

// CNIAnswer is the outcome of a CNICall: what the plugin prints and its exit status.
type CNIAnswer struct {
	Exit   int    `json:"exit"`
	Stdout []byte `json:"stdout"`
	Stderr []byte `json:"stderr"`
}

// Attachment names one attachment in a GC request (cni.dev/valid-attachments).
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// Request is one call to the agent.
type Request struct {
	Version     int             `json:"version"`
	Op          string          `json:"op"`
	Network     string          `json:"network,omitempty"`
	ContainerID string          `json:"containerID,omitempty"`
	IfName      string          `json:"ifname,omitempty"`
	Ranges      []pool.RangeSet `json:"ranges,omitempty"`
	// BlockSize: ADD in cluster mode, the ipam config's blockSize (0: the defaults).
	BlockSize int `json:"blockSize,omitempty"`
	// Exclude: ADD, the ipam config's exclude (addresses and CIDRs no pod gets;
	// ParseExclude reads each).
	Exclude []string `json:"exclude,omitempty"`
	Pod     Pod      `json:"pod,omitzero"`
	NetNS   NetNS    `json:"netns,omitzero"`
	// GC: the attachments of Network that are still valid.
	Valid []Attachment `json:"valid,omitempty"`
	// CHECK: the addresses the runtime believes the attachment has.
	IPs []string `json:"ips,omitempty"`
	// History: the address; Release: the reason detail.
	IP     string `json:"ip,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Release: release even when the runtime reports the sandbox READY (or cannot
	// be asked). Without it the agent refuses such a release.
	ForceReadySandbox bool `json:"forceReadySandbox,omitempty"`
	// CNI: OpCNI's call.
	CNI *CNICall `json:"cni,omitempty"`
}

// Key is the attachment the request names.
func (r Request) Key() Key {
	return Key{Network: r.Network, ContainerID: r.ContainerID, IfName: r.IfName}
}

// Error codes carried in responses; the plugin maps them to CNI codes.
const (
	CodeInvalid     = "invalid"     // bad request field
	CodeExhausted   = "exhausted"   // no free address
	CodeConflict    = "conflict"    // ranges differ from the network's pool
	CodeNotFound    = "not-found"   // no lease (CHECK)
	CodeMismatch    = "mismatch"    // CHECK found different addresses or netns
	CodeStore       = "store"       // the state store failed; nothing changed
	CodeUnavailable = "unavailable" // the agent cannot serve now (draining, starting)
	CodeInternal    = "internal"
)

// Error is an error answered by the agent.
type Error struct {
	Code string `json:"code"`
	Msg  string `json:"msg"`
}

func (e *Error) Error() string { return e.Msg }

// LeaseView is a lease as shown to operators and in the contract of
// `ipledgerctl leases -o json`.
type LeaseView struct {
	Network     string    `json:"network"`
	ContainerID string    `json:"containerID"`
	IfName      string    `json:"ifname"`
	IPs         []string  `json:"ips"`
	Gateways    []string  `json:"gateways,omitempty"`
	Namespace   string    `json:"namespace,omitempty"`
	Name        string    `json:"name,omitempty"`
	UID         string    `json:"uid,omitempty"`
	Infra       string    `json:"infraContainerID,omitempty"`
	NetNS       string    `json:"netns,omitempty"`
	NetNSID     string    `json:"netnsID,omitempty"`
	Created     time.Time `json:"created"`
	State       string    `json:"state"`
	// Why the lease has its addresses (Lease.Why): "default pool", "requested by
	// ipledger.io/ip", "sticky for web-0 (StatefulSet default/web)", "sticky for
	// web-0, borrowed from node node2". Empty for a lease made before the agent
	// recorded it.
	Why string `json:"why,omitempty"`
	// Pool is the IPPool the addresses came from (Lease.Pool: a named pool of
	// cluster mode, whose blocks are that pool's); empty for the network's own.
	Pool string `json:"pool,omitempty"`
	// Reconciler's view, when a runtime is configured.
	Sandbox string `json:"sandbox,omitempty"` // READY, NOTREADY, GONE, UNKNOWN
	Suspect string `json:"suspect,omitempty"` // why the lease is suspected, if it is
	// Verdict is the reconciler's class of a suspected lease: suspect, stranded or
	// leaked (see VerdictSuspect…); empty when not suspected.
	Verdict string `json:"verdict,omitempty"`
	// Cluster mode: the block (CIDR) the lease's address lies in, and Lost when the
	// node no longer owns that block (it was reclaimed while the node could not prove
	// its lease): such a lease is released locally only.
	Block string `json:"block,omitempty"`
	Lost  bool   `json:"lost,omitempty"`
	// With --node-name, the lease's pod as the Kubernetes API shows it (the agent's
	// watch of this node's pods): PodPhase is its status.phase, PodInAPI is PodInAPIYes
	// or PodInAPINo (deleted). Both are empty when the agent cannot tell (no watch,
	// not listed yet, no pod recorded with the lease). The reconciler weighs the
	// same facts, never alone (see internal/reconcile).
	PodPhase string `json:"podPhase,omitempty"`
	PodInAPI string `json:"podInAPI,omitempty"`
}

// LeaseView.PodInAPI values.
const (
	PodInAPIYes = "yes"
	PodInAPINo  = "no"
)

// Block states in BlockView.State, as the answering node sees them.
const (
	BlockOwned     = "owned"     // owned by the answering node, which allocates from it
	BlockSuspended = "suspended" // owned by the answering node, which cannot prove its lease now
	BlockOther     = "other"     // owned by another node
	BlockFree      = "free"      // owned by nobody (handed back or never claimed)
	BlockLost      = "lost"      // the answering node's ledger uses it, but another node owns it now
)

// BlockView is one address block of a cluster-wide pool, `ipledgerctl blocks`.
type BlockView struct {
	Network string `json:"network"`
	Block   string `json:"block"` // CIDR
	Owner   string `json:"owner"` // node name; empty when free
	Epoch   int64  `json:"epoch"` // bumped by every change of owner
	State   string `json:"state"` // BlockOwned, BlockOther, BlockFree, BlockLost
	// Used and Free count the answering node's leases in the block and the addresses
	// it may still allocate from it; nil for a block it does not use (only the owner's
	// ledger knows).
	Used *int `json:"used"`
	Free *int `json:"free"`
	// Borrows are the block's addresses kept for StatefulSet pods (sticky), each
	// with the node that borrowed it, if another node holds it now.
	Borrows []Borrow `json:"borrows,omitempty"`
}

// Borrow is an address of a block kept for a StatefulSet pod.
type Borrow struct {
	Addr string `json:"addr"`
	For  string `json:"for"`            // "namespace/statefulset/pod"
	Node string `json:"node,omitempty"` // the borrower, "" while no other node holds it
}

// Cluster is the answer to OpBlocks: cluster mode as one node sees it.
type Cluster struct {
	Node      string `json:"node"`      // the answering node's name
	Datastore string `json:"datastore"` // kubernetes or etcd
	// Degraded: the node cannot prove its lease or reach the datastore; it serves from
	// the blocks it can prove, and Reason says why.
	Degraded bool        `json:"degraded"`
	Reason   string      `json:"reason,omitempty"`
	Blocks   []BlockView `json:"blocks"`
}

// Audit is the answer to OpAudit, the contract of `ipledgerctl audit -o json`.
type Audit struct {
	OK             bool             `json:"ok"`
	Live           int              `json:"live"`
	Suspect        int              `json:"suspect"`
	Stranded       int              `json:"stranded"`
	Leaked         int              `json:"leaked"`
	DoubleAssigned int              `json:"doubleAssigned"`
	Runtime        string           `json:"runtime"` // none, ok, unreachable
	Problems       []string         `json:"problems"`
	Doubles        []DoubleAssigned `json:"doubles,omitempty"`
	SuspectLeases  []LeaseView      `json:"suspectLeases,omitempty"`
	Pools          []PoolAudit      `json:"pools"`
}

// Response is the agent's answer.
type Response struct {
	Version int         `json:"version"`
	Error   *Error      `json:"error,omitempty"`
	Lease   *LeaseView  `json:"lease,omitempty"`
	Leases  []LeaseView `json:"leases,omitempty"`
	Audit   *Audit      `json:"audit,omitempty"`
	History []Release   `json:"history,omitempty"`
	Pool    *PoolStatus `json:"pool,omitempty"`
	Doctor  *Diagnosis  `json:"doctor,omitempty"`
	Cluster *Cluster    `json:"cluster,omitempty"`
	// Released counts leases released (DEL, GC, release).
	Released int `json:"released"`
	// Existed is true when ADD returned an existing lease.
	Existed bool `json:"existed,omitempty"`
	// CNI: the answer to OpCNI.
	CNI *CNIAnswer `json:"cni,omitempty"`
}

// ErrUnreachable: the agent's socket is missing or refuses connections.
var ErrUnreachable = errors.New("agent unreachable")

// ErrNoAnswer: the agent took the request but closed the connection (or timed out)
// before answering, e.g. because it was killed; the request may or may not have been
// applied. Every verb is idempotent, so the caller may retry (or spool a DEL). When the
// ctx's deadline is what ended the wait, the error is also os.ErrDeadlineExceeded.
var ErrNoAnswer = errors.New("agent gave no answer")

// CallFunc sends req to the agent at socket and returns its answer, with Call's
// errors. Call is the one that dials the socket; the plugins and the CLI take a
// CallFunc so that the agent (running the plugin's verbs in its own process) and tests
// can answer instead.
type CallFunc func(ctx context.Context, socket string, req Request) (*Response, error)

var _ CallFunc = Call

// Call sends req to the agent at socket and returns its answer. An agent error comes
// back as *Error; a socket that cannot be reached as ErrUnreachable (wrapped, naming the
// socket). A wait that ctx's deadline ended is also os.ErrDeadlineExceeded: the read
// deadline fires on its own, and ctx.Err() may still be nil then on a busy machine.
func Call(ctx context.Context, socket string, req Request) (*Response, error) {
	req.Version = Version
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%w: socket %s: %w (is ipledgerd running?)", ErrUnreachable, socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	b, err := MarshalRequest(req)
	if err != nil {
		return nil, err
	}
	_, werr := conn.Write(append(b, '\n'))
	r := bufio.NewReader(conn) // readLine joins longer lines
	line, err := readLine(r, MaxResponse)
	if err != nil {
		if werr != nil {
			return nil, fmt.Errorf("%w: socket %s: write: %w", ErrUnreachable, socket, werr)
		}
		return nil, fmt.Errorf("%w: socket %s: reading the answer: %w", ErrNoAnswer, socket, err)
	}
	// an agent that refused the request (too large) may have answered before the
	// write ended: its answer is read and returned below
	var resp Response
	if err := UnmarshalResponse(line, &resp); err != nil {
		return nil, fmt.Errorf("socket %s: bad answer: %w", socket, err)
	}
	if resp.Version != Version {
		return nil, fmt.Errorf("socket %s: agent speaks protocol version %d, this client %d; use binaries of one release", socket, resp.Version, Version)
	}
	if resp.Error != nil {
		return &resp, resp.Error
	}
	return &resp, nil
}

// ReadRequest reads one request line.
func ReadRequest(r *bufio.Reader) (Request, error) {
	var req Request
	line, err := readLine(r, MaxRequest)
	if errors.Is(err, errTooLong) {
		return req, fmt.Errorf("%w: longer than %d bytes; a request is a few KiB (too many ranges or valid attachments?)", ErrRequestTooLarge, MaxRequest)
	}
	if err != nil {
		return req, err
	}
	if err := UnmarshalRequest(line, &req); err != nil {
		return req, fmt.Errorf("request is not valid JSON: %w", err)
	}
	return req, nil
}

var errTooLong = errors.New("message too long")

func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	var out []byte
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			return nil, err
		}
		out = append(out, chunk...)
		if len(out) > limit {
			return nil, fmt.Errorf("%w: longer than %d bytes", errTooLong, limit)
		}
		if !isPrefix {
			return out, nil
		}
	}
}

// MaxExclude bounds the entries of Request.Exclude (ipam.exclude).
const MaxExclude = 256

// ParseExclude reads one entry of ipam.exclude: an address (10.0.0.5, fd00::5) or a
// CIDR without host bits (10.0.0.16/28). The error says what to write instead.
func ParseExclude(s string) (netip.Prefix, error) { return pool.ParseAddrOrCIDR(s) }
