// Package etcdds is the etcd v3 backend of datastore.Store, on etcd's own client
// (go.etcd.io/etcd/client/v3).
//
// Every key lives under a root prefix (Config.Root, default "/ipledger/"): the
// datastore key "blocks/net1/10-0-0-64-26" is the etcd key
// "/ipledger/blocks/net1/10-0-0-64-26". Revisions are etcd's: a KV's Revision is
// its ModRevision, List's is the response header's.
//
//   - Create is a transaction on CreateRevision == 0; Update and Delete on
//     ModRevision == rev (and the key existing), so of two writers that read the same
//     revision only one is applied, even when the client retries a request.
//   - List reads pages of Config.PageSize keys, every page at the first page's
//     revision (one consistent snapshot).
//   - Watch watches from revision from+1 and requires a leader; etcd's client
//     resumes the stream by itself across a member's restart. Compaction ends it with
//     ErrCompacted; a stream the client gives up on, with ErrUnavailable.
//   - Node leases: an etcd lease granted with the TTL and the key
//     "<root>nodes/<node>" attached to it, holding {holder, ttlSeconds, addrs}. Renew keeps
//     the etcd lease alive once (ErrNotFound when etcd no longer has it) and then
//     rewrites the key on its revision, so its revision changes on every renewal
//     (what observers watch) and a holder that was taken over gets ErrConflict.
//     When the lease expires etcd deletes the key.
package etcdds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ipledger/ipledger/internal/datastore"
)

// Defaults of Config.
const (
	DefaultRoot           = "/ipledger/"
	DefaultDialTimeout    = 5 * time.Second
	DefaultRequestTimeout = 15 * time.Second
	DefaultPageSize       = 500
)

// Config says how to reach etcd.
type Config struct {
	// Endpoints are the etcd members' client URLs (http://127.0.0.1:2379, or
	// https:// with TLS). At least one.
	Endpoints []string
	// DialTimeout bounds the first connection; 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// RequestTimeout bounds a call whose ctx has no deadline (a call with one keeps
	// it); 0 means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Root is the key prefix every record lives under; it must start and end with
	// "/". Empty means DefaultRoot.
	Root string
	// TLS: CAFile verifies the servers (else the system's roots); CertFile and
	// KeyFile, both or neither, authenticate this client. Any of them set, or an
	// https:// endpoint, makes the connection TLS.
	CAFile, CertFile, KeyFile string
	// PageSize is the most keys one List request reads; 0 means DefaultPageSize.
	PageSize int64
}

// Store is a datastore.Store on an etcd cluster.
type Store struct {
	cli     *clientv3.Client
	root    string
	page    int64
	timeout time.Duration
}

var (
	_ datastore.Store  = (*Store)(nil)
	_ datastore.Leases = leases{}
	_ datastore.Watch  = (*watch)(nil)
)

// New connects to etcd. It does not wait for a member to answer: a cluster that is
// down now makes calls fail with ErrUnavailable until it is back.
func New(cfg Config) (*Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: etcd Endpoints: none given; set at least one client URL such as http://127.0.0.1:2379", datastore.ErrInvalid)
	}
	tlsOn := cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != ""
	for _, ep := range cfg.Endpoints {
		switch {
		case strings.HasPrefix(ep, "https://"):
			tlsOn = true
		case strings.HasPrefix(ep, "http://"):
		default:
			return nil, fmt.Errorf("%w: etcd endpoint %q: want a client URL, http://host:port or https://host:port", datastore.ErrInvalid, ep)
		}
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, fmt.Errorf("%w: etcd TLS: CertFile %q and KeyFile %q: give both (client authentication) or neither", datastore.ErrInvalid, cfg.CertFile, cfg.KeyFile)
	}
	root := cfg.Root
	if root == "" {
		root = DefaultRoot
	}
	if !strings.HasPrefix(root, "/") || !strings.HasSuffix(root, "/") {
		return nil, fmt.Errorf("%w: etcd Root %q: must start and end with \"/\", such as %q", datastore.ErrInvalid, root, DefaultRoot)
	}
	c := clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		// The client's own log is retry chatter; what matters reaches the caller as
		// errors.
		Logger: zap.NewNop(),
		// Keepalive pings find a dead member so the client moves to another.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if tlsOn {
		info := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcdds: TLS from CAFile %q CertFile %q KeyFile %q: %w", cfg.CAFile, cfg.CertFile, cfg.KeyFile, err)
		}
		c.TLS = tc
	}
	cli, err := clientv3.New(c)
	if err != nil {
		return nil, fmt.Errorf("etcdds: client for %v: %w", cfg.Endpoints, err)
	}
	s := &Store{cli: cli, root: root, page: cfg.PageSize, timeout: cfg.RequestTimeout}
	if s.page <= 0 {
		s.page = DefaultPageSize
	}
	if s.timeout <= 0 {
		s.timeout = DefaultRequestTimeout
	}
	return s, nil
}

// Close closes the connection; running watches end.
func (s *Store) Close() error { return s.cli.Close() }

// call bounds ctx by the request timeout when it has no deadline of its own.
func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.timeout)
}

// fail maps an etcd client error to the datastore's sentinels, naming what failed.
func fail(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("etcdds: %s: %w: %w (%v)", what, datastore.ErrUnavailable, cerr, err)
		}
		return fmt.Errorf("etcdds: %s: %w", what, cerr)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("etcdds: %s: %w", what, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("etcdds: %s: %w: %w", what, datastore.ErrUnavailable, err)
	}
	if errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("etcdds: %s: %w: %w", what, datastore.ErrCompacted, err)
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcdds: %s: %w: %w", what, datastore.ErrNotFound, err)
	}
	if errors.Is(err, clientv3.ErrNoAvailableEndpoints) {
		return fmt.Errorf("etcdds: %s: %w: %w", what, datastore.ErrUnavailable, err)
	}
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		// Unavailable: no connection, no leader; DeadlineExceeded: the server's own
		// request timeout (a lost quorum); Aborted: a leader change; ResourceExhausted:
		// too many requests. All pass when the cluster recovers.
		return fmt.Errorf("etcdds: %s: %w: %w", what, datastore.ErrUnavailable, err)
	case codes.Canceled:
		return fmt.Errorf("etcdds: %s: %w: %w", what, datastore.ErrUnavailable, err) // the connection closed under the call
	case codes.Unknown:
		// A member whose own wait for the quorum ran out at the propagated deadline
		// answers with the bare context error's text (seen from etcd 3.4 without a
		// leader, a moment before the caller's ctx ends).
		if d := rpctypes.ErrorDesc(err); d == context.DeadlineExceeded.Error() || d == context.Canceled.Error() {
			return fmt.Errorf("etcdds: %s: %w: %w", what, datastore.ErrUnavailable, err)
		}
	}
	return fmt.Errorf("etcdds: %s: %w", what, err)
}

// Get returns key's value and revision.
func (s *Store) Get(ctx context.Context, key string) (datastore.KV, error) {
	if err := datastore.CheckKey(key); err != nil {
		return datastore.KV{}, err
	}
	what := fmt.Sprintf("get %q", key)
	if err := ctx.Err(); err != nil {
		return datastore.KV{}, fail(ctx, what, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, s.root+key)
	if err != nil {
		return datastore.KV{}, fail(cctx, what, err)
	}
	if len(resp.Kvs) == 0 {
		return datastore.KV{}, fmt.Errorf("etcdds: %s: %w", what, datastore.ErrNotFound)
	}
	return s.kv(resp.Kvs[0]), nil
}

func (s *Store) kv(kv *mvccpb.KeyValue) datastore.KV {
	return datastore.KV{Key: strings.TrimPrefix(string(kv.Key), s.root), Value: kv.Value, Revision: kv.ModRevision}
}

// Create stores value under key if the key does not exist.
func (s *Store) Create(ctx context.Context, key string, value []byte) (int64, error) {
	if err := check(key, value); err != nil {
		return 0, err
	}
	what := fmt.Sprintf("create %q", key)
	if err := ctx.Err(); err != nil {
		return 0, fail(ctx, what, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	k := s.root + key
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(value))).
		Commit()
	if err != nil {
		return 0, fail(cctx, what, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("etcdds: %s: %w", what, datastore.ErrExists)
	}
	return resp.Header.Revision, nil
}

// Update replaces key's value if its revision is rev.
func (s *Store) Update(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	if err := check(key, value); err != nil {
		return 0, err
	}
	what := fmt.Sprintf("update %q at revision %d", key, rev)
	resp, err := s.cas(ctx, what, key, rev, clientv3.OpPut(s.root+key, string(value)))
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// Delete removes key if its revision is rev.
func (s *Store) Delete(ctx context.Context, key string, rev int64) error {
	if err := datastore.CheckKey(key); err != nil {
		return err
	}
	what := fmt.Sprintf("delete %q at revision %d", key, rev)
	_, err := s.cas(ctx, what, key, rev, clientv3.OpDelete(s.root+key))
	return err
}

// cas applies op if key (below the root) exists at revision rev: ErrNotFound when
// it does not exist, ErrConflict when its revision differs.
func (s *Store) cas(ctx context.Context, what, key string, rev int64, op clientv3.Op) (*clientv3.TxnResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, fail(ctx, what, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	k := s.root + key
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), ">", 0), clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
		Then(op).
		Else(clientv3.OpGet(k, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		return nil, fail(cctx, what, err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		return nil, fmt.Errorf("etcdds: %s: %w (now at %d)", what, datastore.ErrConflict, kvs[0].ModRevision)
	}
	return nil, fmt.Errorf("etcdds: %s: %w", what, datastore.ErrNotFound)
}

// List returns every key under prefix in key order and the revision it read them at.
func (s *Store) List(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	if err := datastore.CheckPrefix(prefix); err != nil {
		return nil, 0, err
	}
	return s.list(ctx, fmt.Sprintf("list %q", prefix), s.root+prefix, nil)
}

// list reads every key under the etcd prefix p, page by page at one revision, and
// calls each (if not nil) for every key.
func (s *Store) list(ctx context.Context, what, p string, each func(*mvccpb.KeyValue)) ([]datastore.KV, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, fail(ctx, what, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	end := clientv3.GetPrefixRangeEnd(p)
	var out []datastore.KV
	var rev int64
	from := p
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(s.page)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(cctx, from, opts...)
		if err != nil {
			return nil, 0, fail(cctx, what, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if each != nil {
				each(kv)
			}
			out = append(out, s.kv(kv))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Watch streams every change under prefix after revision from.
func (s *Store) Watch(ctx context.Context, prefix string, from int64) (datastore.Watch, error) {
	if err := datastore.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	what := fmt.Sprintf("watch %q from revision %d", prefix, from)
	if err := ctx.Err(); err != nil {
		return nil, fail(ctx, what, err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.cli.Watch(wctx, s.root+prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1))
	w := &watch{ch: make(chan datastore.Event)}
	go w.run(ctx, cancel, wch, s, what)
	return w, nil
}

type watch struct {
	ch  chan datastore.Event
	err error // set before ch closes
}

func (w *watch) Events() <-chan datastore.Event { return w.ch }

// Err is safe once Events is closed (the close orders the write before the read).
func (w *watch) Err() error { return w.err }

func (w *watch) run(ctx context.Context, cancel context.CancelFunc, wch clientv3.WatchChan, s *Store, what string) {
	defer close(w.ch)
	defer cancel()
	for resp := range wch {
		if err := resp.Err(); err != nil {
			if ctx.Err() != nil {
				return
			}
			if resp.CompactRevision != 0 || errors.Is(err, rpctypes.ErrCompacted) {
				w.err = fmt.Errorf("etcdds: %s: %w (history starts at %d): list again", what, datastore.ErrCompacted, resp.CompactRevision)
			} else {
				w.err = fmt.Errorf("etcdds: %s: %w: %w", what, datastore.ErrUnavailable, err)
			}
			return
		}
		for _, ev := range resp.Events {
			out := datastore.Event{Type: datastore.Put, KV: s.kv(ev.Kv)}
			if ev.Type == clientv3.EventTypeDelete {
				out.Type = datastore.Deleted
				out.KV.Value = nil
			}
			select {
			case w.ch <- out:
			case <-ctx.Done():
				return
			}
		}
	}
	if ctx.Err() == nil {
		w.err = fmt.Errorf("etcdds: %s: %w: the stream ended (client closed?)", what, datastore.ErrUnavailable)
	}
}

// Leases returns the node leases.
func (s *Store) Leases() datastore.Leases { return leases{s} }

type leases struct{ s *Store }

// leaseValue is what the key nodes/<node> holds. Addrs is absent from the records
// of agents that published none (and of older releases): they read with none.
type leaseValue struct {
	Holder     string       `json:"holder"`
	TTLSeconds int64        `json:"ttlSeconds"`
	Addrs      []netip.Addr `json:"addrs,omitempty"`
}

func (l leases) key(node string) string { return l.s.root + datastore.LeaseKind + "/" + node }

// Acquire grants an etcd lease with ttl and writes node's key on it, taking over
// whatever lease the node had.
func (l leases) Acquire(ctx context.Context, node, holder string, ttl time.Duration, addrs ...netip.Addr) (datastore.NodeLease, error) {
	if err := datastore.CheckNode(node, holder, ttl); err != nil {
		return datastore.NodeLease{}, err
	}
	if err := datastore.CheckAddrs(node, addrs); err != nil {
		return datastore.NodeLease{}, err
	}
	addrs = slices.Clone(addrs)
	s := l.s
	what := fmt.Sprintf("acquire lease of node %q for %q", node, holder)
	if err := ctx.Err(); err != nil {
		return datastore.NodeLease{}, fail(ctx, what, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	secs := int64(ttl / time.Second)
	g, err := s.cli.Grant(cctx, secs)
	if err != nil {
		return datastore.NodeLease{}, fail(cctx, what, err)
	}
	val, _ := json.Marshal(leaseValue{Holder: holder, TTLSeconds: secs, Addrs: addrs})
	resp, err := s.cli.Put(cctx, l.key(node), string(val), clientv3.WithLease(g.ID))
	if err != nil {
		// The lease holds nothing; it would expire anyway.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		s.cli.Revoke(rctx, g.ID)
		rcancel()
		return datastore.NodeLease{}, fail(cctx, what, err)
	}
	return datastore.NodeLease{Node: node, Holder: holder, TTL: ttl, Revision: resp.Header.Revision, ID: leaseID(g.ID), Addrs: addrs}, nil
}

func leaseID(id clientv3.LeaseID) string { return strconv.FormatInt(int64(id), 16) }

func parseLeaseID(nl datastore.NodeLease) (clientv3.LeaseID, error) {
	id, err := strconv.ParseInt(nl.ID, 16, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%w: lease of node %q: ID %q is not an etcd lease ID (hex)", datastore.ErrInvalid, nl.Node, nl.ID)
	}
	return clientv3.LeaseID(id), nil
}

// Renew keeps the etcd lease alive and rewrites the node's key on its revision.
func (l leases) Renew(ctx context.Context, nl datastore.NodeLease) (datastore.NodeLease, error) {
	if err := datastore.CheckNode(nl.Node, nl.Holder, nl.TTL); err != nil {
		return datastore.NodeLease{}, err
	}
	if err := datastore.CheckAddrs(nl.Node, nl.Addrs); err != nil {
		return datastore.NodeLease{}, err
	}
	id, err := parseLeaseID(nl)
	if err != nil {
		return datastore.NodeLease{}, err
	}
	s := l.s
	what := fmt.Sprintf("renew lease of node %q at revision %d", nl.Node, nl.Revision)
	if err := ctx.Err(); err != nil {
		return datastore.NodeLease{}, fail(ctx, what, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	// First the keepalive: the server restarts the TTL from when it receives it,
	// which is after the caller sent Renew.
	if _, err := s.cli.KeepAliveOnce(cctx, id); err != nil {
		return datastore.NodeLease{}, fail(cctx, what, err)
	}
	k := l.key(nl.Node)
	val, _ := json.Marshal(leaseValue{Holder: nl.Holder, TTLSeconds: int64(nl.TTL / time.Second), Addrs: nl.Addrs})
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), ">", 0), clientv3.Compare(clientv3.ModRevision(k), "=", nl.Revision)).
		Then(clientv3.OpPut(k, string(val), clientv3.WithLease(id))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return datastore.NodeLease{}, fail(cctx, what, err)
	}
	if !resp.Succeeded {
		return datastore.NodeLease{}, l.lost(what, resp)
	}
	nl.Revision = resp.Header.Revision
	return nl, nil
}

// lost explains a failed compare on a lease key: gone, or written by somebody else.
func (l leases) lost(what string, resp *clientv3.TxnResponse) error {
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return fmt.Errorf("etcdds: %s: %w (expired or released)", what, datastore.ErrNotFound)
	}
	var v leaseValue
	_ = json.Unmarshal(kvs[0].Value, &v)
	return fmt.Errorf("etcdds: %s: %w (now revision %d, holder %q)", what, datastore.ErrConflict, kvs[0].ModRevision, v.Holder)
}

// Release deletes the node's key if nl is current, then revokes the etcd lease.
func (l leases) Release(ctx context.Context, nl datastore.NodeLease) error {
	if err := datastore.CheckNode(nl.Node, nl.Holder, nl.TTL); err != nil {
		return err
	}
	id, err := parseLeaseID(nl)
	if err != nil {
		return err
	}
	s := l.s
	what := fmt.Sprintf("release lease of node %q at revision %d", nl.Node, nl.Revision)
	if err := ctx.Err(); err != nil {
		return fail(ctx, what, err)
	}
	cctx, cancel := s.call(ctx)
	defer cancel()
	k := l.key(nl.Node)
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), ">", 0), clientv3.Compare(clientv3.ModRevision(k), "=", nl.Revision)).
		Then(clientv3.OpDelete(k)).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return fail(cctx, what, err)
	}
	if !resp.Succeeded {
		return l.lost(what, resp)
	}
	// The record is gone; the etcd lease would expire by itself, so a failed
	// revoke changes nothing anybody reads.
	_, _ = s.cli.Revoke(cctx, id)
	return nil
}

// List returns every node's lease, in node order.
func (l leases) List(ctx context.Context) ([]datastore.NodeLease, error) {
	s := l.s
	var out []datastore.NodeLease
	var bad error
	prefix := s.root + datastore.LeaseKind + "/"
	_, _, err := s.list(ctx, "list node leases", prefix, func(kv *mvccpb.KeyValue) {
		nl, err := decodeLease(strings.TrimPrefix(string(kv.Key), prefix), kv.Value)
		if err != nil {
			if bad == nil {
				bad = err
			}
			return
		}
		nl.Revision, nl.ID = kv.ModRevision, leaseID(clientv3.LeaseID(kv.Lease))
		out = append(out, nl)
	})
	if err != nil {
		return nil, err
	}
	if bad != nil {
		return nil, bad
	}
	return out, nil
}

// decodeLease reads the record of node's lease (without its revision and ID, which
// etcd keeps beside the value).
func decodeLease(node string, val []byte) (datastore.NodeLease, error) {
	var v leaseValue
	if err := json.Unmarshal(val, &v); err != nil {
		return datastore.NodeLease{}, fmt.Errorf("etcdds: lease record of node %q: %w", node, err)
	}
	return datastore.NodeLease{Node: node, Holder: v.Holder, TTL: time.Duration(v.TTLSeconds) * time.Second, Addrs: v.Addrs}, nil
}

func check(key string, value []byte) error {
	if err := datastore.CheckKey(key); err != nil {
		return err
	}
	return datastore.CheckValue(key, value)
}
