package veth_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// TestIPAMHandedToAgent: with an ipam section of type ipledger the plugin hands ADD and
// DEL to the agent itself (one request "cni", no exec of the IPAM plugin); when the
// agent does not take them (an agent of an older release, here a relay answering as
// one) it execs the IPAM plugin from CNI_PATH as before, which then talks to the agent
// itself. Both give the pod its addresses and release them, and an IPAM error reaches
// the runtime the same either way.
func TestIPAMHandedToAgent(t *testing.T) {
	a := agentenv.Start(t, agentenv.Options{Args: []string{"--reuse-delay", "0s"}})
	ipam := &ipledgerIPAM{a: a}
	// CNI_PATH: an "ipledger" that records each exec and runs the real one
	pathDir := t.TempDir()
	execLog := filepath.Join(pathDir, "exec.log")
	wrapper := fmt.Sprintf("#!/bin/sh\necho \"$CNI_COMMAND\" >> %s\nexec %s \"$@\"\n", execLog, filepath.Join(binDir, "ipledger"))
	if err := os.WriteFile(filepath.Join(pathDir, "ipledger"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	execs := func() []string {
		b, err := os.ReadFile(execLog)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		os.Remove(execLog)
		return strings.Fields(string(b))
	}
	run := func(t *testing.T, command, containerID, netns string, conf []byte) pluginRun {
		t.Helper()
		return execPluginPath(t, pathDir, command, containerID, netns, "eth0", conf)
	}
	network := fmt.Sprintf("handover%d", os.Getpid()%100000)
	cleanupNetwork(t, network)
	p := pool{idx: 14}
	errOut := map[bool][]byte{}
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("older agent %v", old), func(t *testing.T) {
			mode := agentenv.Pass
			if old {
				mode = agentenv.OldAgent
			}
			r := a.StartRelay(t, mode)
			section := ipam.Section(p, false, false)
			section["socket"] = r.Socket
			conf := confBytes(t, "1.0.0", network, section, nil)
			// the verb's requests and execs: the plugin's hand-over, then (older
			// agent) the IPAM plugin's exec and its own request
			want := func(verb, op string) ([]string, []string) {
				if old {
					return []string{api.OpCNI, op}, []string{verb}
				}
				return []string{api.OpCNI}, nil
			}
			check := func(t *testing.T, verb, op string) {
				t.Helper()
				wantOps, wantExecs := want(verb, op)
				if ops, ex := r.Take(), execs(); !slices.Equal(ops, wantOps) || !slices.Equal(ex, wantExecs) {
					t.Errorf("%s: requests %q and IPAM execs %q, want %q and %q", verb, ops, ex, wantOps, wantExecs)
				}
			}
			id := fmt.Sprintf("hand%v", old)
			ns := netenv.Namespace(t, "iplt-hand").Path
			add := run(t, "ADD", id, ns, conf)
			add.ok(t)
			check(t, "ADD", api.OpAdd)
			ips := resultIPs(t, add.stdout)
			if held := ipam.Leases(t, network); len(ips) != 1 || !slices.Equal(held, strs(ips)) {
				t.Fatalf("ADD gave %v, the agent holds %v", ips, held)
			}
			ping(t, ns, ips[0])

			// an IPAM error: the network's pool redefined while a lease holds it (a pool
			// that holds no lease is replaced instead)
			bad := ipam.Section(pool{idx: 15}, false, false)
			bad["socket"] = r.Socket
			failed := run(t, "ADD", id+"bad", netenv.Namespace(t, "iplt-hand").Path, confBytes(t, "1.0.0", network, bad, nil))
			failed.cniError(t)
			check(t, "ADD", api.OpAdd)
			errOut[old] = failed.stdout

			run(t, "DEL", id, ns, conf).ok(t)
			check(t, "DEL", api.OpDel)
			if held := ipam.Leases(t, network); len(held) != 0 {
				t.Fatalf("after DEL the agent holds %v", held)
			}
		})
	}
	if !bytes.Equal(errOut[false], errOut[true]) {
		t.Errorf("the IPAM error reached the runtime differently:\nhanded to the agent %s\nexec'd IPAM plugin  %s", errOut[false], errOut[true])
	}

	// An agent that takes the hand-over and never answers (a relay that reads and
	// stays silent): the plugin waits ipam.timeout once and answers as the IPAM plugin
	// would after its own wait, without exec'ing it to wait again. ADD fails with code
	// 11 and leaves nothing on the host; DEL is spooled where the agent reads, and the
	// agent applies it.
	t.Run("agent hung", func(t *testing.T) {
		mute := a.StartRelay(t, agentenv.Mute)
		hung := ipam.Section(p, false, false)
		hung["socket"], hung["timeout"] = mute.Socket, "300ms"
		conf := confBytes(t, "1.0.0", network, hung, nil)
		check := func(t *testing.T, verb string) {
			t.Helper()
			if ops, ex := mute.Take(), execs(); !slices.Equal(ops, []string{api.OpCNI}) || len(ex) != 0 {
				t.Errorf("%s: requests %q and IPAM execs %q, want one %q and no exec", verb, ops, ex, api.OpCNI)
			}
		}
		failed := run(t, "ADD", "hungadd", netenv.Namespace(t, "iplt-hand").Path, conf)
		if e := failed.cniError(t); e.Code != types.ErrTryAgainLater {
			t.Errorf("ADD against a hung agent: %+v, want code %d (try again later)", e, types.ErrTryAgainLater)
		}
		check(t, "ADD")

		ns := netenv.Namespace(t, "iplt-hand").Path
		run(t, "ADD", "hungdel", ns, confBytes(t, "1.0.0", network, ipam.Section(p, false, false), nil)).ok(t)
		execs()
		if held := ipam.Leases(t, network); len(held) != 1 {
			t.Fatalf("the agent holds %v, want the one lease of hungdel", held)
		}
		del := run(t, "DEL", "hungdel", ns, conf)
		del.ok(t)
		check(t, "DEL")
		if !strings.Contains(string(del.stderr), "spooled in "+a.SpoolDir) {
			t.Errorf("DEL against a hung agent: stderr %q, want it spooled in %s", del.stderr, a.SpoolDir)
		}
		for deadline := time.Now().Add(30 * time.Second); len(ipam.Leases(t, network)) != 0; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the agent did not apply the spooled DEL: it holds %v", ipam.Leases(t, network))
			}
		}
	})
}
