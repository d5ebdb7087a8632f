// Package clustertest holds what tests of cluster mode share, in-process
// (internal/cluster) and with real agents (test/cluster): an operator's edit of a
// pool record and the range edits they make.
package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore"
)

// EditPool changes pool record name as an operator's edit does (kubectl edit, an
// etcd transaction on mod_revision): read, change with edit, write back
// conditioned on the revision read; a conflict reads again, so two operators'
// edits cannot lose one another. The test fails when the record cannot be read
// or written, or keeps changing under the edit.
func EditPool(t testing.TB, ds datastore.Store, name string, edit func(spec map[string]any)) {
	t.Helper()
	ctx := context.Background()
	for range 20 {
		kv, err := ds.Get(ctx, cluster.PoolKey(name))
		if err != nil {
			t.Fatalf("reading pool %s: %v", name, err)
		}
		var spec map[string]any
		if err := json.Unmarshal(kv.Value, &spec); err != nil {
			t.Fatalf("pool %s: %v", name, err)
		}
		edit(spec)
		v, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ds.Update(ctx, kv.Key, v, kv.Revision); errors.Is(err, datastore.ErrConflict) {
			continue
		} else if err != nil {
			t.Fatalf("writing pool %s: %v", name, err)
		}
		t.Logf("pool record %s now %s", name, v)
		return
	}
	t.Fatalf("pool %s kept changing under the edit", name)
}

// AddRange is an edit that appends a range of subnet to range set 0.
func AddRange(subnet string) func(spec map[string]any) {
	return func(spec map[string]any) {
		sets := spec["ranges"].([]any)
		sets[0] = append(sets[0].([]any), map[string]any{"subnet": subnet})
	}
}

// DrainRange is an edit that removes the range of subnet from range set 0 and,
// for a network's default pool (named false: not an IPPool), lists it under
// drained, so that a conflist that still names it does not add it back. It
// panics when range set 0 has no such range (the test's own mistake).
func DrainRange(subnet string, named bool) func(spec map[string]any) {
	return func(spec map[string]any) {
		sets := spec["ranges"].([]any)
		set := sets[0].([]any)
		i := slices.IndexFunc(set, IsRange(subnet))
		if i < 0 {
			panic("no range " + subnet)
		}
		if !named {
			d, _ := spec["drained"].([]any)
			spec["drained"] = append(d, set[i])
		}
		sets[0] = slices.Delete(set, i, i+1)
	}
}

// IsRange reports whether a range of a spec (a JSON object) has subnet.
func IsRange(subnet string) func(r any) bool {
	return func(r any) bool { return r.(map[string]any)["subnet"] == subnet }
}

// UndrainRange is an edit that moves the range of subnet from a default pool's
// drained list back to the end of range set 0 (drained left [] when it was the
// last). It panics when drained has no such range.
func UndrainRange(subnet string) func(spec map[string]any) {
	return func(spec map[string]any) {
		d, _ := spec["drained"].([]any)
		i := slices.IndexFunc(d, IsRange(subnet))
		if i < 0 {
			panic("no drained range " + subnet)
		}
		sets := spec["ranges"].([]any)
		sets[0] = append(sets[0].([]any), d[i])
		spec["drained"] = slices.Delete(d, i, i+1)
	}
}
