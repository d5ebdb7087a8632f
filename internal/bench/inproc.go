package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/store/boltstore"
	"github.com/ipledger/ipledger/internal/store/walstore"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// binaries reports the plugins' size and start time (VERSION, which answers without
// the agent) next to host-local's, ptp's and the floor's.
func (h *harness) binaries() error {
	size := func(name string) (float64, error) {
		fi, err := os.Stat(h.bin(name))
		if err != nil {
			return 0, err
		}
		return float64(fi.Size()) / (1 << 20), nil
	}
	pairs := [][2]string{{"ipledger", "host-local"}, {"ipledger-veth", "ptp"}}
	floorSize, err := size("noop")
	if err != nil {
		return err
	}
	for _, p := range pairs {
		a, err := size(p[0])
		if err != nil {
			return err
		}
		b, err := size(p[1])
		if err != nil {
			return err
		}
		h.row(groupBinary, fmt.Sprintf("%s size (baseline %s)", p[0], p[1]), "MiB", a, b, floorSize)
	}
	n := h.opts.Samples
	starts := make([]dist, 4)
	var floor dist
	version := []byte(`{"cniVersion":"` + cniVersion + `"}`)
	for i := 0; i < n; i++ {
		for j, name := range []string{"ipledger", "host-local", "ipledger-veth", "ptp"} {
			d, _, err := h.exec(call{plugin: name, command: "VERSION", containerID: "version", conf: version})
			if err != nil {
				return err
			}
			starts[j] = append(starts[j], d)
		}
		d, err := h.floor(nil)
		if err != nil {
			return err
		}
		floor = append(floor, d)
	}
	h.row(groupBinary, "ipledger start (VERSION) p50 (baseline host-local)", "ms", starts[0].p50(), starts[1].p50(), floor.p50())
	h.row(groupBinary, "ipledger-veth start (VERSION) p50 (baseline ptp)", "ms", starts[2].p50(), starts[3].p50(), floor.p50())
	return nil
}

func ledgerRateName(n, callers int) string {
	return fmt.Sprintf("ledger durable allocate or release at %s live leases, %d caller(s)", kilo(n), callers)
}

func kilo(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// ledgerRate measures the ledger on the agent's store (walstore) in-process: durable operations
// (one allocate or one release, each its own fsync'd transaction) per second with
// LedgerLeases live leases, from one caller and from 16.
func (h *harness) ledgerRate() error {
	n := h.opts.LedgerLeases
	path := filepath.Join(h.work, "ledger", "ledger.db")
	sets, err := pool.ParseRangeSets([]byte(rangesJSON(subnetLedger)))
	if err != nil {
		return err
	}
	// fill without fsync (as the boltstore benchmark does), then reopen durable
	st, err := boltstore.Open(path, boltstore.WithoutSync())
	if err != nil {
		return err
	}
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		st.Close()
		return err
	}
	for i := 0; i < n; i++ {
		pod := ledger.Pod{Namespace: "bench", Name: fmt.Sprint("pod-", i), UID: fmt.Sprint("uid-", i)}
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledger.Key{Network: ledgerNet, ContainerID: fmt.Sprintf("fill-%06d", i), IfName: "eth0"}, Pod: pod, Ranges: sets}); err != nil {
			l.Close()
			return err
		}
	}
	l.Close()
	// reopen durable on the agent's store: the write-ahead log in front of the file
	wst, err := walstore.Open(path)
	if err != nil {
		return err
	}
	if l, err = ledger.Open(wst, ledger.Options{}); err != nil {
		wst.Close()
		return err
	}
	defer l.Close()
	for _, callers := range []int{1, 16} {
		var ops atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var first error
		deadline := time.Now().Add(h.opts.LedgerTime / 2)
		start := time.Now()
		for c := 0; c < callers; c++ {
			wg.Go(func() {
				for i := 0; time.Now().Before(deadline); i++ {
					k := ledger.Key{Network: ledgerNet, ContainerID: fmt.Sprintf("op-%02d-%d-%07d", callers, c, i), IfName: "eth0"}
					_, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Ranges: sets})
					if err == nil {
						_, _, err = l.Release(k, ledger.ReasonDEL, "")
					}
					if err != nil {
						mu.Lock()
						first = err
						mu.Unlock()
						return
					}
					ops.Add(2)
				}
			})
		}
		wg.Wait()
		if first != nil {
			return first
		}
		h.row(groupLedger, ledgerRateName(n, callers), "ops/s", float64(ops.Load())/time.Since(start).Seconds(), nan, nan)
	}
	return nil
}

const rssName = "agent VmRSS at "

// agentStartName is the row of the agent's start on a ledger of n live leases.
func agentStartName(n int) string {
	return fmt.Sprintf("agent start until it answers, %s live leases", kilo(n))
}

// agentRSS starts a second agent, fills it with AgentLeases leases through the
// socket API from 32 parallel callers and reads its VmRSS; then it times a restart on
// that ledger.
func (h *harness) agentRSS() error {
	n := h.opts.AgentLeases
	a := agentenv.Start(h.tb, agentenv.Options{Args: []string{"--reuse-delay", "0s", "--log-level", "info"}})
	empty, err := vmRSS(a.PID())
	if err != nil {
		return err
	}
	h.row(groupLedger, "agent VmRSS, empty ledger", "MiB", empty, nan, nan)
	sets, err := pool.ParseRangeSets([]byte(rangesJSON(subnetAgentRSS)))
	if err != nil {
		return err
	}
	const callers = 32
	start := time.Now()
	if err := parallel(n, callers, func(i int) error {
		return h.apiAdd(a.Socket, rssNet, fmt.Sprintf("rss-%06d", i), sets)
	}); err != nil {
		return err
	}
	h.row(groupLedger, fmt.Sprintf("agent socket API durable ADDs/s, %d callers (filling %s)", callers, kilo(n)), "ops/s", float64(n)/time.Since(start).Seconds(), nan, nan)
	rss, err := vmRSS(a.PID())
	if err != nil {
		return err
	}
	h.row(groupLedger, rssName+kilo(n)+" live leases", "MiB", rss, nan, nan)
	if err := a.Stop(); err != nil {
		return fmt.Errorf("stopping the agent: %w", err)
	}
	t0 := time.Now()
	a.Restart()
	h.row(groupLedger, agentStartName(n), "ms", ms(time.Since(t0)), nan, nan)
	restarted, err := vmRSS(a.PID())
	if err != nil {
		return err
	}
	h.row(groupLedger, rssName+kilo(n)+" live leases, after a restart", "MiB", restarted, nan, nan)
	return a.Stop()
}

// vmRSS reads VmRSS of pid from /proc, in MiB.
func vmRSS(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				return 0, fmt.Errorf("VmRSS of %d: %q: %w", pid, v, err)
			}
			return float64(kb) / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
