#!/usr/bin/env bash
# make demo: a real job on this machine (as root). It builds the demo driver
# (test/demo: it uses the test environment, so it is never installed) and runs it:
# a private containerd and ipledgerd on its embedded store, a few hundred real pod
# sandboxes through ipledger-veth + ipledger while the seed faults are injected
# (empty-netns DELs, a stale /proc/PID/ns/net DEL, a failing chained plugin,
# ipledgerd and containerd killed -9 and restarted, sandboxes whose DEL never comes),
# the same churn against bridge + host-local, both books side by side, then a short
# `ipledgerctl sim` table. Everything it starts is stopped by PID and everything it
# makes is removed, also on ^C (the driver's cleanups; this script's trap removes the
# driver binary).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "demo: run as root (it starts containerd and creates network namespaces)" >&2; exit 1; }
export PATH=$PATH:/usr/local/go/bin
DIR=$(mktemp -d /tmp/ipl-demo-bin-XXXX)
trap 'rm -rf "$DIR"' EXIT
go build -o "$DIR/demo" ./test/demo
"$DIR/demo"
