package ledger

import (
	"container/heap"
	"time"
)

// freeHeap orders the free addresses of one range set by release sequence, so that
// the least recently released address is at the top; every element knows its index
// so that one can be taken out of the middle (same-UID reuse) in O(log n).
type freeHeap []*freeItem

type freeItem struct {
	f     Free
	mono  time.Duration // monotonic reading of the release (or of the load that found it)
	index int
	// parked: the address belongs to a block that does not hand out addresses now
	// (suspended); it is in the set's index but not in the heap.
	parked bool
}

func (h freeHeap) Len() int           { return len(h) }
func (h freeHeap) Less(i, j int) bool { return h[i].f.Seq < h[j].f.Seq }
func (h freeHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *freeHeap) Push(x any) {
	it := x.(*freeItem)
	it.index = len(*h)
	*h = append(*h, it)
}
func (h *freeHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	it.index = -1
	return it
}

func (h *freeHeap) add(it *freeItem)    { heap.Push(h, it) }
func (h *freeHeap) remove(it *freeItem) { heap.Remove(h, it.index) }
func (h freeHeap) top() *freeItem {
	if len(h) == 0 {
		return nil
	}
	return h[0]
}
