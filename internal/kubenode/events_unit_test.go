package kubenode

import (
	"log/slog"
	"testing"
	"time"

	"k8s.io/client-go/tools/events"
)

// Pod Events: the same (pod, reason, note) is recorded once within PodEventDedupe,
// and at most PodEventsPerMinute a minute.
func TestPodEventDedupe(t *testing.T) {
	rec := events.NewFakeRecorder(2 * PodEventsPerMinute)
	e := newEvents(nil, rec, nil, slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	e.now = func() time.Time { return now }
	count := func() int {
		n := 0
		for {
			select {
			case <-rec.Events:
				n++
			default:
				return n
			}
		}
	}
	for range 3 {
		e.PodEvent("ns", "p", "u", "Normal", "AddressReleased", "Release", "address 10.1.2.3 released")
	}
	e.PodEvent("ns", "p", "u", "Normal", "AddressReleased", "Release", "address 10.1.2.4 released")
	e.PodEvent("ns", "", "", "Normal", "AddressReleased", "Release", "no pod")
	if n := count(); n != 2 {
		t.Fatalf("%d Events recorded, want 2 (one per note)", n)
	}
	now = now.Add(PodEventDedupe)
	e.PodEvent("ns", "p", "u", "Normal", "AddressReleased", "Release", "address 10.1.2.3 released")
	if n := count(); n != 1 {
		t.Fatalf("%d Events recorded after the dedupe window, want 1", n)
	}
	now = now.Add(time.Hour)
	for i := range PodEventsPerMinute + 10 {
		e.PodEvent("ns", "p", "u", "Normal", "AddressReleased", "Release", string(rune('a'+i%26))+time.Duration(i).String())
	}
	if n := count(); n != PodEventsPerMinute {
		t.Fatalf("%d Events recorded in one minute, want the budget %d", n, PodEventsPerMinute)
	}
}
