package main

import (
	"log/slog"

	"github.com/vishvananda/netns"

	"github.com/ipledger/ipledger/internal/nodenet/masq"
)

// nodeNetworkOn reports whether the agent runs the node network: it knows the other
// nodes (the Kubernetes Nodes, or etcd mode's node leases) and --routes or
// --masquerade is on.
func nodeNetworkOn(o *options) bool {
	return o.network.Enabled(o.cluster.Kubernetes() || o.cluster.Cluster() && o.cluster.LeaseNodes())
}

// masqueradeOn reports whether this run keeps the masquerade table.
func masqueradeOn(o *options) bool { return nodeNetworkOn(o) && o.network.Masquerade }

// removeNetfilterTurnedOff removes, at start, the netfilter state of an earlier run
// that this run does not keep: the table inet ipledger when masquerade is off
// (--masquerade=false, or no --node-name), and the FORWARD accepts of the pod
// ranges when the node network is off. Left in place, they would keep masquerading
// and accepting the pod ranges of that run (stale once a pool or podCIDR changes)
// and hide from the operator that the feature is off. A failure is logged, never
// fatal: the agent still serves addresses, and doctor shows the table.
func removeNetfilterTurnedOff(o *options, log *slog.Logger) {
	if !masqueradeOn(o) {
		removed, err := masq.New(netns.None()).RemoveIfPresent()
		switch {
		case err != nil:
			log.Warn("masquerade is off, but the table inet ipledger of an earlier run could not be removed; remove it by hand: nft delete table inet ipledger", "err", err)
		case removed:
			log.Info("masquerade is off: removed the table inet ipledger an earlier run installed")
		}
	}
	if !nodeNetworkOn(o) {
		removed, err := masq.NewForward(netns.None()).Remove()
		switch {
		case err != nil:
			log.Warn("the node network is off, but the FORWARD accepts of an earlier run could not be removed; remove them by hand: iptables -D FORWARD -j "+masq.ForwardChain+"; iptables -F "+masq.ForwardChain+"; iptables -X "+masq.ForwardChain+" (and ip6tables)", "err", err)
		case removed:
			log.Info("the node network is off: removed the FORWARD accepts (chain " + masq.ForwardChain + ") an earlier run installed")
		}
	}
}
