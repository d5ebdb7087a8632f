package kubenode_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/rest"

	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/controller"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// allOffLink stands for a route reconciler on a node that shares no network with
// the others: every desired route through another node is off-link (the node's
// own unreachable routes have no next hop).
type allOffLink struct{}

func (allOffLink) Sync(desired []nodenet.Route) (routes.Report, error) {
	var rep routes.Report
	for _, d := range desired {
		if d.Type == nodenet.Unreachable {
			continue
		}
		rep.OffLink = append(rep.OffLink, routes.OffLink{Dst: d.Dst, Via: d.Via})
	}
	return rep, nil
}

// offLinkEvent runs the node network's controller on the real Node watch and
// Events against a real kube-apiserver: an off-link next hop becomes one Warning
// Event (events.k8s.io) on this node's Node, however many reconciliations see it,
// which the core Events API shows under the Node as `kubectl describe node` asks
// for it (kind Node, name, and the node's name as UID, as the kubelet's).
func offLinkEvent(t *testing.T, api *kubeenv.APIServer) {
	c, err := corev1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	createNode(t, c, "node-a", []string{"10.244.1.0/24"}, "10.250.0.11")
	createNode(t, c, "node-b", []string{"10.244.2.0/24"}, "192.0.2.7")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := kubenode.New(api.Config(), "node-a", logger(t))
	if err != nil {
		t.Fatal(err)
	}
	w.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if !w.WaitSynced(wctx) {
		t.Fatal("the watch did not list the Nodes within 30s")
	}
	ev, err := kubenode.NewEvents(ctx, api.Config(), "node-a", logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := controller.New(controller.Config{Self: "node-a", Nodes: w, Routes: allOffLink{}, Resync: time.Hour, Events: ev, Log: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		ctl.Reconcile(ctx)
	}

	ec, err := eventsv1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	want := controller.OffLinkNote("node-a", "node-b", netip.MustParseAddr("192.0.2.7"), []string{"10.244.2.0/24"})
	eventually(t, "the off-link Event on node-a", func() bool {
		l, err := ec.Events("default").List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) > 0
	})
	time.Sleep(time.Second) // a second Event, if any, would be sent by now
	l, err := ec.Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 {
		t.Fatalf("%d Events, want one: %+v", len(l.Items), l.Items)
	}
	e := l.Items[0]
	if e.Type != "Warning" || e.Reason != controller.ReasonRouteNextHopOffLink || e.Action != controller.ActionRoute ||
		e.Regarding.Kind != "Node" || e.Regarding.Name != "node-a" || e.Note != want || e.ReportingController != kubenode.EventsController {
		t.Fatalf("Event %+v\nwant Warning %s on Node node-a saying %q", e, controller.ReasonRouteNextHopOffLink, want)
	}
	t.Logf("Event: %s %s on %s/%s: %s", e.Type, e.Reason, e.Regarding.Kind, e.Regarding.Name, e.Note)
	core, err := c.Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=node-a,involvedObject.uid=node-a"})
	if err != nil || len(core.Items) != 1 || core.Items[0].Message != want {
		t.Fatalf("core Events of Node node-a: %+v, %v; want the one Event", core, err)
	}
}

// eventSeries: the same Event recorded again is counted into the series of the
// Event already created, as the kubelet's are (`kubectl describe` shows "x3"),
// and another note is another Event; a Pod Event regards the pod by UID.
func eventSeries(t *testing.T, api *kubeenv.APIServer) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ev, err := kubenode.NewEvents(ctx, api.Config(), "node-a", logger(t))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		ev.Warning("SomeReason", "SomeAction", "the same note")
	}
	ev.Warning("SomeReason", "SomeAction", "another note")
	ev.PodEvent("default", "pod-a", "uid-a", "Normal", "AddressReleased", "Release", "address 10.1.2.3 released")
	ec, err := eventsv1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	eventually(t, "two Events on the Node, the first of a series of 3, and one on the pod", func() bool {
		got = map[string]string{}
		l, err := ec.Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range l.Items {
			count := int32(1)
			if e.Series != nil {
				count = e.Series.Count
			}
			got[fmt.Sprintf("%s/%s/%s %s %s %s", e.Regarding.Kind, e.Regarding.Name, e.Regarding.UID, e.Type, e.Reason, e.Note)] = fmt.Sprint(count, " ", e.ReportingController)
		}
		return len(got) == 3 && got["Node/node-a/node-a Warning SomeReason the same note"] == "3 "+kubenode.EventsController
	})
	want := map[string]string{
		"Node/node-a/node-a Warning SomeReason the same note":              "3 " + kubenode.EventsController,
		"Node/node-a/node-a Warning SomeReason another note":               "1 " + kubenode.EventsController,
		"Pod/pod-a/uid-a Normal AddressReleased address 10.1.2.3 released": "1 " + kubenode.EventsController,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Events in namespace default (regarding type reason note: series count, controller):\n%v\nwant\n%v", got, want)
	}
}

// TestEventsNeverBlock: with an API server that does not answer, recording an Event
// returns at once (the broadcaster sends in the background and gives up).
func TestEventsNeverBlock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ev, err := kubenode.NewEvents(ctx, &rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}, "node-a", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range 100 {
		ev.Warning(controller.ReasonRouteNextHopOffLink, controller.ActionRoute, strings.Repeat("x", 2000))
		ev.PodEvent("default", "pod-a", "uid-a", "Normal", "AddressReleased", "Release", fmt.Sprintf("address 10.1.2.%d released", i))
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("200 Events took %s with the API server away", d)
	}
}
