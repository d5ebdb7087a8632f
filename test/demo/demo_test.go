package main

import (
	"bytes"
	"context"
	"testing"
)

// A small demo, so that `make demo` cannot rot: ipledger's books balance after every
// injected fault; host-local keeps the addresses of the sandboxes whose DEL never
// came to it.
func TestDemoSmall(t *testing.T) {
	var out bytes.Buffer
	books, err := Run(context.Background(), t, Options{Churn: 16, Faulty: 3, Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	var o bytes.Buffer
	PrintBooks(&o, books)
	t.Log(o.String())
	if len(books) != 2 {
		t.Fatalf("%d books, want ipledger and host-local", len(books))
	}
	ipl, hl := books[0], books[1]
	if ipl.Leaked() != 0 || ipl.Held != 0 || !ipl.AuditOK {
		t.Errorf("ipledger: held %d, live %d, audit ok %v; want balanced and empty", ipl.Held, ipl.LiveAtEnd, ipl.AuditOK)
	}
	if hl.Leaked() < 3 {
		t.Errorf("host-local leaked %d; the 3 sandboxes whose DEL never came keep their addresses", hl.Leaked())
	}
}
