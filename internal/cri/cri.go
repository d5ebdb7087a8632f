// Package cri is a small client of the Kubernetes Container Runtime Interface
// (runtime.v1) over gRPC. The node agent's reconciler reads pod sandboxes with
// it; tests and benchmarks also drive pods with it the way kubelet does.
//
// Every call is bounded by the per-call timeout given to Dial.
package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// maxMsgSize bounds one response; a node's sandbox list fits easily.
const maxMsgSize = 16 << 20

// State is the state of a pod sandbox as the runtime reports it.
type State int

const (
	// StateUnknown is a state the runtime did not report or we do not know.
	StateUnknown State = iota
	// StateReady is a running sandbox (SANDBOX_READY).
	StateReady
	// StateNotReady is a stopped or failed sandbox (SANDBOX_NOTREADY).
	StateNotReady
)

// String returns READY, NOTREADY or UNKNOWN.
func (s State) String() string {
	switch s {
	case StateReady:
		return "READY"
	case StateNotReady:
		return "NOTREADY"
	default:
		return "UNKNOWN"
	}
}

func stateOf(s runtimeapi.PodSandboxState) State {
	switch s {
	case runtimeapi.PodSandboxState_SANDBOX_READY:
		return StateReady
	case runtimeapi.PodSandboxState_SANDBOX_NOTREADY:
		return StateNotReady
	default:
		return StateUnknown
	}
}

// Sandbox is what the runtime reports about one pod sandbox.
type Sandbox struct {
	ID        string
	State     State
	Namespace string // pod namespace, from metadata
	Name      string // pod name, from metadata
	UID       string // pod UID, from metadata
	Attempt   uint32 // sandbox attempt, from metadata
	CreatedAt time.Time
	Labels    map[string]string
	// Annotations as given at RunPodSandbox.
	Annotations map[string]string
	// IPs is the pod's primary and additional IPs (SandboxStatus only).
	IPs []string
	// NetNSPath is the sandbox's network namespace path when the runtime's
	// verbose status reveals it (containerd does; SandboxStatus only).
	// Empty when unknown. The path may no longer exist for a stopped sandbox.
	NetNSPath string
}

// Ready reports whether the runtime says the sandbox is READY.
func (s Sandbox) Ready() bool { return s.State == StateReady }

// RuntimeVersion is the answer of the Version call.
type RuntimeVersion struct {
	Name       string // e.g. containerd
	Version    string // e.g. 1.6.20~ds1
	APIVersion string // e.g. v1
}

// Client is a CRI runtime-service client. It is safe for concurrent use.
type Client struct {
	endpoint string
	timeout  time.Duration
	conn     *grpc.ClientConn
	rt       runtimeapi.RuntimeServiceClient
}

// socketPath returns the filesystem path of a unix endpoint: "unix:///path"
// or a bare absolute path.
func socketPath(endpoint string) (string, error) {
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		p := strings.TrimPrefix(endpoint, "unix://")
		if !filepath.IsAbs(p) {
			return "", fmt.Errorf("cri: endpoint %q: want unix:///absolute/path", endpoint)
		}
		return p, nil
	case filepath.IsAbs(endpoint):
		return endpoint, nil
	default:
		return "", fmt.Errorf("cri: endpoint %q: only unix sockets are supported (unix:///path)", endpoint)
	}
}

// Dial connects to the CRI endpoint (unix:///run/containerd/containerd.sock
// or a bare socket path) and checks that the runtime answers a Version call.
// timeout bounds that check and every later call of the client. It fails with
// an error naming the endpoint when the socket is missing or the runtime does
// not answer. The connection reconnects on its own if the runtime restarts.
func Dial(ctx context.Context, endpoint string, timeout time.Duration) (*Client, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("cri: dial %s: timeout must be positive", endpoint)
	}
	path, err := socketPath(endpoint)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cri: dial %s: runtime socket missing: %w", endpoint, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("cri: dial %s: %s is not a unix socket", endpoint, path)
	}
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize)),
	)
	if err != nil {
		return nil, fmt.Errorf("cri: dial %s: %w", endpoint, err)
	}
	c := &Client{endpoint: endpoint, timeout: timeout, conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn)}
	if _, err := c.Version(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// Endpoint returns the endpoint the client was dialed with.
func (c *Client) Endpoint() string { return c.endpoint }

// Close releases the connection.
func (c *Client) Close() error { return c.conn.Close() }

// call derives the per-call context.
func (c *Client) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// wrap names the operation and endpoint and maps gRPC NotFound to ErrNotFound.
func (c *Client) wrap(op, id string, err error) error {
	what := op
	if id != "" {
		what = op + " " + id
	}
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("cri %s: %s: %w: %v", c.endpoint, what, ErrNotFound, err)
	}
	return fmt.Errorf("cri %s: %s: %w", c.endpoint, what, err)
}

// Version asks the runtime for its name and versions.
func (c *Client) Version(ctx context.Context) (RuntimeVersion, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	r, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{Version: "v1"})
	if err != nil {
		return RuntimeVersion{}, c.wrap("version", "", err)
	}
	return RuntimeVersion{Name: r.GetRuntimeName(), Version: r.GetRuntimeVersion(), APIVersion: r.GetRuntimeApiVersion()}, nil
}

// ListSandboxes returns every sandbox the runtime knows, in all states.
func (c *Client) ListSandboxes(ctx context.Context) ([]Sandbox, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	r, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, c.wrap("list sandboxes", "", err)
	}
	out := make([]Sandbox, 0, len(r.GetItems()))
	for _, it := range r.GetItems() {
		md := it.GetMetadata()
		out = append(out, Sandbox{
			ID:          it.GetId(),
			State:       stateOf(it.GetState()),
			Namespace:   md.GetNamespace(),
			Name:        md.GetName(),
			UID:         md.GetUid(),
			Attempt:     md.GetAttempt(),
			CreatedAt:   nanoTime(it.GetCreatedAt()),
			Labels:      it.GetLabels(),
			Annotations: it.GetAnnotations(),
		})
	}
	return out, nil
}

// SandboxStatus returns the status of one sandbox, including its IPs and,
// when the runtime's verbose info reveals it, its network namespace path.
// It returns an error wrapping ErrNotFound when the runtime does not know id.
func (c *Client) SandboxStatus(ctx context.Context, id string) (Sandbox, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	r, err := c.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return Sandbox{}, c.wrap("sandbox status", id, err)
	}
	st := r.GetStatus()
	if st == nil {
		return Sandbox{}, c.wrap("sandbox status", id, errors.New("runtime returned no status"))
	}
	md := st.GetMetadata()
	s := Sandbox{
		ID:          st.GetId(),
		State:       stateOf(st.GetState()),
		Namespace:   md.GetNamespace(),
		Name:        md.GetName(),
		UID:         md.GetUid(),
		Attempt:     md.GetAttempt(),
		CreatedAt:   nanoTime(st.GetCreatedAt()),
		Labels:      st.GetLabels(),
		Annotations: st.GetAnnotations(),
		NetNSPath:   netnsFromInfo(r.GetInfo()),
	}
	if n := st.GetNetwork(); n != nil {
		if ip := n.GetIp(); ip != "" {
			s.IPs = append(s.IPs, ip)
		}
		for _, a := range n.GetAdditionalIps() {
			if a.GetIp() != "" {
				s.IPs = append(s.IPs, a.GetIp())
			}
		}
	}
	return s, nil
}

func nanoTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// netnsFromInfo digs the network namespace path out of the verbose info
// (containerd: {"info": "{... \"runtimeSpec\": {\"linux\": {\"namespaces\": [...]}}}"}).
// It never fails: anything unexpected yields "".
func netnsFromInfo(info map[string]string) string {
	type spec struct {
		Linux *struct {
			Namespaces []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
		} `json:"linux"`
	}
	var v struct {
		RuntimeSpec *spec `json:"runtimeSpec"`
	}
	// "info" first: that is where containerd puts it.
	keys := []string{"info"}
	for k := range info {
		if k != "info" {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		raw, ok := info[k]
		if !ok || raw == "" {
			continue
		}
		v.RuntimeSpec = nil
		if json.Unmarshal([]byte(raw), &v) != nil || v.RuntimeSpec == nil || v.RuntimeSpec.Linux == nil {
			continue
		}
		for _, ns := range v.RuntimeSpec.Linux.Namespaces {
			if ns.Type == "network" && ns.Path != "" {
				return ns.Path
			}
		}
	}
	return ""
}
