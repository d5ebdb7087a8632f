#!/usr/bin/env bash
# make demo: a real job on this machine (as root). It starts ipledgerd in a temporary
# directory, gives three pods (real network namespaces) their veth and addresses
# through ipledger-veth + ipledger exactly as a runtime would, loses a DEL while the
# agent is down (spooled, applied at restart), sends a DEL with an empty CNI_NETNS,
# and prints the leases, an address's history and the audit.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
[ "$(id -u)" -eq 0 ] || { echo "demo: run as root (it creates network namespaces and veths)" >&2; exit 1; }
command -v ip >/dev/null || { echo "demo: needs iproute2 (apt-get install iproute2)" >&2; exit 1; }
DIR=$(mktemp -d /tmp/ipl-demo-XXXX)
SOCK=$DIR/s.sock
AGENT_PID=
PODS=(demo-a demo-b demo-c)
cleanup() {
  [ -n "$AGENT_PID" ] && kill -TERM "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null || true
  for p in "${PODS[@]}"; do ip netns del "ipl-$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT

start_agent() {
  "$BIN/ipledgerd" --state-dir "$DIR/state" --socket "$SOCK" --reuse-delay 5s 2>>"$DIR/agent.log" &
  AGENT_PID=$!
  for _ in $(seq 100); do "$BIN/ipledgerctl" --socket "$SOCK" pools >/dev/null 2>&1 && return; sleep 0.05; done
  echo "demo: agent did not start; its log:" >&2; cat "$DIR/agent.log" >&2; exit 1
}
stop_agent() { kill -TERM "$AGENT_PID"; wait "$AGENT_PID" || true; AGENT_PID=; }

CONF=$(cat <<JSON
{"cniVersion":"1.1.0","name":"demo","type":"ipledger-veth","mtu":1500,
 "ipam":{"type":"ipledger","socket":"$SOCK","spoolDir":"$DIR/state/spool",
         "ranges":[[{"subnet":"10.123.0.0/28"}],[{"subnet":"fd00:123::/120"}]]}}
JSON
)
cni() { # verb pod netns
  echo "$CONF" | CNI_COMMAND=$1 CNI_CONTAINERID="sandbox-$2" CNI_NETNS="$3" CNI_IFNAME=eth0 CNI_PATH="$BIN" \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=$2;K8S_POD_UID=uid-$2" "$BIN/ipledger-veth"
}
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "start ipledgerd (state in $DIR/state)"
start_agent
for p in "${PODS[@]}"; do
  ip netns add "ipl-$p"
  say "ADD $p"
  cni ADD "$p" "/run/netns/ipl-$p" | grep -oE '"(address|name)": "[^"]*"' | tr '\n' ' '; echo
  ip -n "ipl-$p" -br addr show dev eth0
done
say "leases"
"$BIN/ipledgerctl" --socket "$SOCK" leases
say "DEL demo-a with an empty CNI_NETNS (the second DEL containerd sends)"
cni DEL demo-a ""
say "agent stopped; DEL demo-b is spooled durably and answered success"
stop_agent
cni DEL demo-b "/run/netns/ipl-demo-b" && echo "DEL answered success; spool: $(ls "$DIR/state/spool")"
say "agent restarted: the spool is applied before it serves"
start_agent
"$BIN/ipledgerctl" --socket "$SOCK" leases
say "history of 10.123.0.2"
"$BIN/ipledgerctl" --socket "$SOCK" history --network demo --ip 10.123.0.2
say "audit"
"$BIN/ipledgerctl" --socket "$SOCK" audit
say "doctor (exit 1 here: WARN, no runtime configured for this demo)"
"$BIN/ipledgerctl" --socket "$SOCK" doctor --netns /proc/self/ns/net || [ $? -eq 1 ]
