package kubenode

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
)

// Pod Events: the same (pod, reason, note) is recorded once within PodEventDedupe,
// and at most PodEventsPerMinute a minute.
func TestPodEventDedupe(t *testing.T) {
	rec := events.NewFakeRecorder(2 * PodEventsPerMinute)
	e := newEvents(rec, nil, slog.New(slog.DiscardHandler))
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

// The sender tries a failed send again, with a growing pause, up to maxTries,
// and an Event the API server refuses as invalid only once.
func TestSenderRetries(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fail      int // the first fail POSTs answer code
		code      int
		wantPosts int32
		sent      bool
	}{
		{"two failures, then created", 2, http.StatusInternalServerError, 3, true},
		{"failing for good", 100, http.StatusInternalServerError, maxTries, false},
		{"invalid", 100, http.StatusUnprocessableEntity, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var posts atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != "/apis/events.k8s.io/v1/namespaces/default/events" {
					t.Errorf("%s %s, want a POST of an Event in namespace default", r.Method, r.URL.Path)
				}
				w.Header().Set("Content-Type", "application/json")
				if int(posts.Add(1)) <= tc.fail {
					w.WriteHeader(tc.code)
					fmt.Fprintf(w, `{"apiVersion":"v1","kind":"Status","status":"Failure","code":%d,"reason":%q}`, tc.code, reasonOf(tc.code))
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, `{"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":"node-a.1","namespace":"default"}}`)
			}))
			t.Cleanup(srv.Close)
			c, err := restClient(&rest.Config{Host: srv.URL}, eventsV1)
			if err != nil {
				t.Fatal(err)
			}
			s := newSender(c, EventsController, "test", slog.New(slog.DiscardHandler))
			s.retryAfter = time.Millisecond
			s.Eventf(&corev1.ObjectReference{Kind: "Node", Name: "node-a", UID: "node-a"}, nil, "Warning", "R", "A", "%s", "note")
			s.send(context.Background(), <-s.queue)
			if got := posts.Load(); got != tc.wantPosts {
				t.Errorf("%d POSTs, want %d", got, tc.wantPosts)
			}
			if sent := len(s.series) == 1; sent != tc.sent {
				t.Errorf("Event created: %v, want %v", sent, tc.sent)
			}
		})
	}
}

func reasonOf(code int) string {
	if code == http.StatusUnprocessableEntity {
		return "Invalid"
	}
	return "InternalError"
}
