package agent_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/memds"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
)

// ipChoices is a pod's annotations as the pod watch would give them (the real
// watch, kubenode.Pods, is TestAnnotationsOnOneAPIServer's).
type ipChoices map[string]map[string]string

var _ agent.Choices = ipChoices(nil)

func (c ipChoices) Choices(_ context.Context, ns, name, _ string) (map[string]string, error) {
	return c[ns+"/"+name], nil
}
func (c ipChoices) NamespaceChoices(context.Context, string) (map[string]string, error) {
	return nil, nil
}
func (c ipChoices) NodeLabels(context.Context) (map[string]string, error) { return nil, nil }

// In cluster mode, with the real copy of the IPReservations on the datastore:
// before the copy has listed, an ADD fails with "try again later" naming why
// and allocates nothing; once it has, a pod's ipledger.io/ip inside a
// reservation is refused naming the IPReservation, its reason and the fix,
// with a Warning Event, and nothing is allocated or claimed (ledger and
// datastore unchanged); a pod without a choice never gets a reserved address;
// with the datastore gone (the watch broken) ADDs fail again as unknown.
func TestReservationsThroughTheAgent(t *testing.T) {
	clk := clocktest.New()
	ds := memds.New(clk)
	if _, err := ds.Create(context.Background(), cluster.ReservationKey("gw"), []byte(`{"addresses":["10.60.0.0/30","10.60.0.9"],"reason":"routers"}`)); err != nil {
		t.Fatal(err)
	}
	rs := cluster.NewReservations(ds.Open(), ledgertest.TestLogger(t))
	ev := &recordedEvents{}
	choices := ipChoices{"default/ldap": {"ipledger.io/ip": "10.60.0.9"}}
	n := newClusterNode(t, ds, clk, "node-a", func(c *agent.Config) { c.Reservations, c.Choices, c.Events = rs, choices, ev })
	addCtx := func(ctx context.Context, cid string) *api.Response {
		return n.s.Handle(ctx, api.Request{Version: api.Version, Op: api.OpAdd, Network: "pods", ContainerID: cid, IfName: "eth0",
			Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.60.0.0/27"}]]`), BlockSize: 28, Pod: api.Pod{Namespace: "default", Name: cid, UID: "u-" + cid}})
	}
	add := func(cid string) *api.Response { return addCtx(context.Background(), cid) }
	// an ADD before the first list waits for it, within its own deadline
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	r := addCtx(short, "early")
	cancelShort()
	if r.Error == nil || r.Error.Code != api.CodeUnavailable || !strings.Contains(r.Error.Msg, "not listed yet") || len(n.l.Leases("")) != 0 {
		t.Fatalf("ADD before the reservations were listed: %+v, leases %v; want unavailable naming why, nothing allocated", r.Error, n.l.Leases(""))
	}
	waited := make(chan *api.Response, 1)
	go func() { waited <- add("waits") }()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rs.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	if r := <-waited; r.Error != nil || r.Lease == nil {
		t.Fatalf("ADD waiting for the first list: %+v, want an address once listed", r)
	}
	if r := n.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpDel, Network: "pods", ContainerID: "waits", IfName: "eth0"}); r.Error != nil {
		t.Fatal(r.Error)
	}
	for {
		if _, err := rs.Current(); err == nil {
			break
		}
		<-rs.Changed()
	}
	blocksBefore, _, err := ds.List(context.Background(), "blocks/")
	if err != nil {
		t.Fatal(err)
	}
	r = add("ldap")
	if r.Error == nil || r.Error.Code != api.CodeInvalid {
		t.Fatalf("ipledger.io/ip of a reserved address: %+v, want refused", r)
	}
	for _, want := range []string{"ipledger.io/ip on pod default/ldap asks for 10.60.0.9", "reserved by IPReservation gw (routers)", "give an address outside every IPReservation", "or remove the annotation"} {
		if !strings.Contains(r.Error.Msg, want) {
			t.Errorf("refusal %q lacks %q", r.Error.Msg, want)
		}
	}
	if got := ev.take(); len(got) != 1 || got[0].reason != agent.ReasonAddressChoiceRefused || got[0].note != r.Error.Msg {
		t.Errorf("events %+v, want one AddressChoiceRefused with the message", got)
	}
	blocksAfter, _, _ := ds.List(context.Background(), "blocks/")
	if len(n.l.Leases("")) != 0 || len(blocksAfter) != len(blocksBefore) {
		t.Fatalf("a refused choice allocated or claimed: leases %v, blocks %d -> %d", n.l.Leases(""), len(blocksBefore), len(blocksAfter))
	}
	for i := range 10 {
		r := add("p" + string(rune('a'+i)))
		if r.Error != nil {
			t.Fatal(r.Error)
		}
		if ip := r.Lease.IPs[0]; strings.HasPrefix(ip, "10.60.0.1/") || strings.HasPrefix(ip, "10.60.0.2/") || strings.HasPrefix(ip, "10.60.0.3/") || strings.HasPrefix(ip, "10.60.0.9/") {
			t.Fatalf("pod got reserved %s", ip)
		}
	}
	ds.SetAvailable(false)
	for {
		if _, err := rs.Current(); err != nil {
			break
		}
		<-rs.Changed()
	}
	if r := add("late"); r.Error == nil || r.Error.Code != api.CodeUnavailable || !strings.Contains(r.Error.Msg, "while the reserved ones are unknown") {
		t.Fatalf("ADD with the reservations' watch broken: %+v, want unavailable", r.Error)
	}
}
