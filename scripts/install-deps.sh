#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh Debian machine (run as root).
# Idempotent: packages already present are not fetched again.
set -euo pipefail
# iptables: the kubelet of test/kube writes its chains with it; busybox-static: the
# test pods' image (/bin/busybox) and bounded pings from the node.
pkgs=(iproute2 containerd runc containernetworking-plugins iptables busybox-static)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v go >/dev/null; then
  echo "install-deps: Go is not installed: put Go 1.26 (go.mod's version) on PATH or in /usr/local/go (https://go.dev/dl/); then run make test again" >&2
  exit 1
fi
go mod download
