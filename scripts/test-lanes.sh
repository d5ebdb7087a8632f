#!/usr/bin/env bash
# test-lanes.sh: `make test`'s two lanes, run at the same time.
#
#   scripts/test-lanes.sh LOGDIR [go test flags...]
#   scripts/test-lanes.sh --list    (each package and its lane; runs nothing)
#
# The kubelet lane is the packages in KUBELET_PKGS (the Makefile's list: those
# whose tests start a kubelet cluster), built with the tag KUBELET_TAGS that
# their cluster tests carry. Each cluster holds the host-wide lock
# /var/cache/ipledger/kube/.cluster.lock until its test process exits, so these
# packages' clusters run one after the other whatever -p says. The lane runs
# with -p 2 all the same: while one package's clusters run, go test compiles
# and links the next and starts it, and it waits at the lock, so no package
# waits for its own build (about two minutes of the lane's wall time in five
# builds). A package may then wait a whole predecessor's run before its own:
# the lane's -timeout is 40m, after the flags given (the last one wins).
# The other lane is every other package of the module, -p 1, beside the
# first: none of them starts a kubelet or touches what a kubelet cluster
# changes on the host (internal/testenv/README.md says what was checked).
#
# Both lanes stream to the terminal with a prefix (kubelet| , other| ) and to
# LOGDIR/lane-kubelet.log and LOGDIR/lane-other.log. The script ends with each
# lane's verdict, the packages and tests that failed with the first lines each
# test logged, and exits 1 if either lane failed.
set -u
if [ $# -lt 1 ]; then
	echo "usage: $0 LOGDIR [go test flags...]" >&2
	exit 2
fi
logdir=$1
shift
GO=${GO:-go}
: "${KUBELET_PKGS:?KUBELET_PKGS, the packages of the kubelet lane, is not set: run make test}"

# Import paths of the kubelet lane, then every other package of the module.
# Listed with the lane's tag: test/kube, test/kubeupstream and test/kubewitness
# hold only tagged files, and without it go list refuses them.
tags=${KUBELET_TAGS:-kubelet}
kube=$($GO list -tags "$tags" $KUBELET_PKGS) || exit 1
others=$($GO list -tags "$tags" ./... | grep -vxF -f <(printf '%s\n' $kube)) || exit 1
if [ "$logdir" = --list ]; then
	printf 'kubelet %s\n' $kube
	printf 'other %s\n' $others
	exit 0
fi
mkdir -p "$logdir"

lane() {
	local name=$1
	shift
	local log=$logdir/lane-$name.log
	{
		"$GO" test "$@" 2>&1
		echo $? >"$logdir/lane-$name.rc"
	} | tee "$log" | sed -u "s/^/$name| /"
}

start=$(date +%s)
lane kubelet -p 2 -tags "$tags" "$@" -timeout 40m $kube &
kpid=$!
lane other -p 1 "$@" $others &
opid=$!
wait $kpid $opid

status=0
t=$(( $(date +%s) - start ))
echo "== make test: $((t / 60)) min $((t % 60)) s wall"
for name in kubelet other; do
	rc=$(cat "$logdir/lane-$name.rc" 2>/dev/null || echo 1)
	if [ "$rc" = 0 ]; then
		echo "== $name lane: ok (log: $logdir/lane-$name.log)"
	else
		status=1
		echo "== $name lane: FAIL (exit $rc; log: $logdir/lane-$name.log)"
		grep -E '^(FAIL|panic:)' "$logdir/lane-$name.log" | grep -vx FAIL | sed 's/^/   /'
		# The failed tests and the first lines each logged, so that a CI that keeps
		# only the end of the output still says what failed and why.
		awk '/^ *--- FAIL: /{n=3; print; next} n>0 && /^ +[^ -]/{print; n--; next} {n=0}' \
			"$logdir/lane-$name.log" | head -24 | cut -c1-240 | sed 's/^/   /'
	fi
done
exit $status
