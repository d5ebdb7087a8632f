#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh Debian machine (run as root).
# Idempotent: packages already present are not fetched again.
# Holds the same lock as the tests' package installer (internal/testenv/debpkg), so a
# test running meanwhile never sees a package half-installed, and two apt-get runs
# never overlap.
set -euo pipefail
lockfile=/run/lock/ipledger-deps.lock
# chromium: the pool page tests; iptables: the kubelet of test/kube writes its chains
# with it; busybox-static: the test pods' image (/bin/busybox) and bounded pings.
# etcd-server: Debian's etcd for the etcd datastore tests (internal/testenv/etcdenv).
# dash, bash, curl, netcat-openbsd, bind9-dnsutils, wget: the tools (and their shared
# libraries) the upstream e2e suite runs inside the agnhost image (internal/testenv/e2eenv).
pkgs=(iproute2 containerd runc containernetworking-plugins chromium iptables busybox-static etcd-server
  dash bash curl netcat-openbsd bind9-dnsutils wget)
install() {
  missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "install-deps: need root to install: ${missing[*]} (run: sudo apt-get install -y ${missing[*]})" >&2
      exit 1
    fi
    echo "install-deps: installing ${missing[*]}" >&2
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${missing[@]}" >/dev/null
  fi
}
if [ "$(id -u)" -eq 0 ]; then
  mkdir -p "$(dirname "$lockfile")"
  exec 9>"$lockfile"
  flock -w 600 9 || { echo "install-deps: $lockfile held for 10 minutes by another installer (see: fuser -v $lockfile)" >&2; exit 1; }
  install
  flock -u 9
  exec 9>&-
else
  install
fi
if ! command -v go >/dev/null; then
  echo "install-deps: Go is not installed: put Go 1.26 (go.mod's version) on PATH or in /usr/local/go (https://go.dev/dl/); then run make test again" >&2
  exit 1
fi
go mod download
