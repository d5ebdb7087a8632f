package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/pool"
)

// Reservation is an operator's IPReservation (the record "reservations/<name>"):
// addresses and CIDRs of either family that no pod gets, whatever pool or
// annotation it asks for. A lease that holds a reserved address when the
// reservation appears keeps it until its pod goes; the address then stays out.
type Reservation struct {
	Name string
	// Prefixes are spec.addresses, each an address (a /32 or /128) or a CIDR, in
	// the order given.
	Prefixes []netip.Prefix
	// Reason is the operator's note (spec.reason), shown by doctor and the pool page.
	Reason string
}

// reservationSpec is the JSON of an IPReservation's spec as the operator writes it.
type reservationSpec struct {
	Addresses []string `json:"addresses"`
	Reason    string   `json:"reason,omitempty"`
}

// Limits of an IPReservation's spec.
const (
	// MaxReservationAddresses bounds spec.addresses (use CIDRs for ranges).
	MaxReservationAddresses = 256
	// MaxReservationReason bounds spec.reason, in bytes.
	MaxReservationReason = 256
)

// ReservationsPrefix is the key prefix of every IPReservation.
const ReservationsPrefix = "reservations/"

// ReservationKey is the key of IPReservation name.
func ReservationKey(name string) string { return ReservationsPrefix + name }

// ParseReservation reads the spec of IPReservation name (a datastore value). An
// error wraps ErrBadReservation and names the field and the fix; the Reservation
// returned with it still holds the entries of spec.addresses that parsed, so that
// a typo in one entry does not give the others' addresses to pods.
func ParseReservation(name string, value []byte) (Reservation, error) {
	r := Reservation{Name: name}
	if err := checkReservationName(name); err != nil {
		return r, err
	}
	var spec reservationSpec
	if err := json.Unmarshal(value, &spec); err != nil {
		return r, fmt.Errorf("%w: IPReservation %s: spec: %v; give spec.addresses as a list of strings, e.g. addresses: [10.244.1.2, 10.244.1.240/28]", ErrBadReservation, name, err)
	}
	var errs []error
	if len(spec.Reason) > MaxReservationReason || !utf8.ValidString(spec.Reason) || strings.ContainsFunc(spec.Reason, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		errs = append(errs, fmt.Errorf("%w: IPReservation %s: spec.reason: at most %d bytes of printable UTF-8 on one line; shorten it", ErrBadReservation, name, MaxReservationReason))
	} else {
		r.Reason = spec.Reason
	}
	switch {
	case len(spec.Addresses) == 0:
		errs = append(errs, fmt.Errorf("%w: IPReservation %s: spec.addresses is missing or empty; give the addresses and CIDRs no pod may get, e.g. addresses: [10.244.1.2, 10.244.1.240/28, \"fd00:10:244::/120\"]", ErrBadReservation, name))
	case len(spec.Addresses) > MaxReservationAddresses:
		errs = append(errs, fmt.Errorf("%w: IPReservation %s: spec.addresses has %d entries, at most %d; merge addresses into CIDRs, or split the reservation", ErrBadReservation, name, len(spec.Addresses), MaxReservationAddresses))
		spec.Addresses = spec.Addresses[:MaxReservationAddresses]
	}
	for i, s := range spec.Addresses {
		p, err := pool.ParseAddrOrCIDR(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: IPReservation %s: spec.addresses[%d]: %v", ErrBadReservation, name, i, err))
			continue
		}
		r.Prefixes = append(r.Prefixes, p)
	}
	return r, errors.Join(errs...)
}

// MarshalReservation is the datastore value of r (the IPReservation's spec).
func MarshalReservation(r Reservation) ([]byte, error) {
	spec := reservationSpec{Reason: r.Reason}
	for _, p := range r.Prefixes {
		if p.IsSingleIP() {
			spec.Addresses = append(spec.Addresses, p.Addr().String())
		} else {
			spec.Addresses = append(spec.Addresses, p.String())
		}
	}
	return json.Marshal(spec)
}

// checkReservationName: an IPReservation's name is a Kubernetes object name (a DNS
// subdomain), which is also a datastore name segment.
func checkReservationName(name string) error {
	bad := name == "" || len(name) > datastore.MaxName
	for _, label := range strings.Split(name, ".") {
		if bad {
			break
		}
		bad = label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.ContainsFunc(label, func(c rune) bool { return !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') })
	}
	if bad {
		return fmt.Errorf("%w: IPReservation name %q: want a DNS subdomain (lowercase letters, digits, '-' and '.', at most %d bytes); rename it", ErrBadReservation, name, datastore.MaxName)
	}
	return nil
}

// Covering returns the first reservation of rs holding a, and whether one does.
func Covering(rs []Reservation, a netip.Addr) (Reservation, bool) {
	for _, r := range rs {
		for _, p := range r.Prefixes {
			if p.Contains(a) {
				return r, true
			}
		}
	}
	return Reservation{}, false
}

// ReservedIn returns the reserved prefixes of rs that overlap ranges (the rest
// cannot matter to an allocation from them), each once, those inside another
// left out.
func ReservedIn(rs []Reservation, ranges []pool.RangeSet) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range rs {
		for _, p := range r.Prefixes {
			if overlapsRanges(p, ranges) {
				out = append(out, p)
			}
		}
	}
	// widest first, so that a prefix inside an earlier one is dropped
	sort.SliceStable(out, func(i, j int) bool { return out[i].Bits() < out[j].Bits() })
	kept := out[:0]
	for _, p := range out {
		if !slices.ContainsFunc(kept, func(k netip.Prefix) bool { return k.Contains(p.Addr()) && k.Bits() <= p.Bits() }) {
			kept = append(kept, p)
		}
	}
	return kept
}

func overlapsRanges(p netip.Prefix, ranges []pool.RangeSet) bool {
	for _, set := range ranges {
		for _, r := range set {
			if r.Subnet.Overlaps(p) {
				return true
			}
		}
	}
	return false
}

// Reservations is a watched copy of every IPReservation: one List, then a Watch
// from its revision; when the watch breaks the copy is not trusted until a new
// List (Run lists again after a pause). An agent asks it at every cluster-mode
// allocation, so an ADD costs the datastore nothing.
type Reservations struct {
	ds  datastore.Store
	log *slog.Logger

	mu     sync.Mutex
	live   bool  // listed since Run began and the watch of that list runs
	cause  error // why the copy is not live (nil while live)
	since  time.Time
	byKey  map[string]parsedReservation
	notify chan struct{}
	// liveCh is closed while the copy is live; broken replaces it with an open one (Live)
	liveCh chan struct{}
	// kick asks Run, waiting out its pause after a break, to list again now (Kick)
	kick chan struct{}
	// pause0 is Run's first pause after a break (a variable for tests)
	pause0 time.Duration
}

type parsedReservation struct {
	r   Reservation
	err error // the spec did not parse (wholly or in part)
}

// NewReservations returns a copy of ds's IPReservations that knows nothing until
// Run lists them.
func NewReservations(ds datastore.Store, log *slog.Logger) *Reservations {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reservations{ds: ds, log: log, cause: errors.New("not listed yet since the agent started"), since: time.Now(), notify: make(chan struct{}, 1), liveCh: make(chan struct{}), kick: make(chan struct{}, 1), pause0: time.Second}
}

// Run keeps the copy until ctx ends: it lists the reservations and watches them
// from the list's revision, and does both again when the watch breaks, after a
// pause that doubles up to 30s while the watches keep breaking within a minute,
// or sooner when an ADD waits for the copy (Kick), though not twice within a
// second. Run it once, in a goroutine of its own.
func (rs *Reservations) Run(ctx context.Context) {
	pause := rs.pause0
	for {
		began := time.Now()
		err := rs.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			pause = rs.pause0
		}
		rs.broken(err)
		rs.log.Warn("the watch of the IPReservations ended; cluster-mode ADDs fail (retryable) until it lists again", "err", err, "retry", pause)
		failed := time.Now()
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		case <-rs.kick:
			if d := time.Second - time.Since(failed); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
		}
		pause = min(2*pause, 30*time.Second)
	}
}

func (rs *Reservations) runOnce(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	kvs, rev, err := rs.ds.List(lctx, ReservationsPrefix)
	cancel()
	if err != nil {
		return fmt.Errorf("listing the IPReservations: %w", err)
	}
	w, err := rs.ds.Watch(ctx, ReservationsPrefix, rev)
	if err != nil {
		return fmt.Errorf("watching the IPReservations: %w", err)
	}
	rs.mu.Lock()
	rs.byKey = make(map[string]parsedReservation, len(kvs))
	for _, kv := range kvs {
		rs.byKey[kv.Key] = parseKV(kv)
	}
	rs.live, rs.cause, rs.since = true, nil, time.Now()
	close(rs.liveCh)
	rs.mu.Unlock()
	rs.changed()
	for ev := range w.Events() {
		rs.mu.Lock()
		if ev.Type == datastore.Deleted {
			delete(rs.byKey, ev.KV.Key)
		} else {
			rs.byKey[ev.KV.Key] = parseKV(ev.KV)
		}
		rs.mu.Unlock()
		rs.changed()
	}
	if err := w.Err(); err != nil {
		return fmt.Errorf("the watch of the IPReservations broke: %w", err)
	}
	return errors.New("the watch of the IPReservations ended")
}

func parseKV(kv datastore.KV) parsedReservation {
	r, err := ParseReservation(strings.TrimPrefix(kv.Key, ReservationsPrefix), kv.Value)
	return parsedReservation{r: r, err: err}
}

func (rs *Reservations) broken(err error) {
	rs.mu.Lock()
	was := rs.live
	rs.live, rs.cause = false, err
	if was {
		rs.since = time.Now()
		rs.liveCh = make(chan struct{})
	}
	rs.mu.Unlock()
	rs.changed()
}

func (rs *Reservations) changed() {
	select {
	case rs.notify <- struct{}{}:
	default:
	}
}

// Live returns a channel closed once the copy is live: listed, and the watch of
// that list running. After a break it is a new channel, closed when the copy
// has listed again (an ADD waits on it rather than fail at once).
func (rs *Reservations) Live() <-chan struct{} {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.liveCh
}

// Kick asks Run, if it waits out its pause after a break, to list again now (at
// most once a second): an ADD is waiting for the copy.
func (rs *Reservations) Kick() {
	select {
	case rs.kick <- struct{}{}:
	default:
	}
}

// Changed receives a value (coalesced) after the copy changed.
func (rs *Reservations) Changed() <-chan struct{} { return rs.notify }

// Current returns every reservation, by name, while the copy is live; otherwise
// an error wrapping ErrReservationsUnknown that says why (not listed since the
// agent started, or its watch broke, and when). A reservation whose spec did not
// parse is in the list with the entries that did.
func (rs *Reservations) Current() ([]Reservation, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !rs.live {
		return nil, fmt.Errorf("%w: %v (since %s)", ErrReservationsUnknown, rs.cause, rs.since.UTC().Format(time.RFC3339))
	}
	out := make([]Reservation, 0, len(rs.byKey))
	for _, p := range rs.byKey {
		out = append(out, p.r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Invalid returns the parse error of each reservation whose spec did not parse,
// by name (what doctor reports).
func (rs *Reservations) Invalid() []error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []error
	for _, p := range rs.byKey {
		if p.err != nil {
			out = append(out, p.err)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Error() < out[j].Error() })
	return out
}
