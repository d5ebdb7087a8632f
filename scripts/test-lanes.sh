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
# The other lane is every other package of the module, one at a time, beside
# the first: none of them starts a kubelet or touches what a kubelet cluster
# changes on the host (internal/testenv/README.md says what was checked). Its
# test binaries are built ahead, two at a time (`go test -c`, in the lane's
# order), and run one at a time as each is ready: `go test -p 1` would build
# and link each package's binary only after the one before has run, on the
# critical path of a lane that waits for nothing else. The go test
# flags given are passed to the binaries as -test.* flags (build flags such
# as -race and -tags to the builds), and the lane prints go test's lines: ok,
# FAIL with the test's output, ? for a package without tests.
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
		if [ "$name" = other ]; then
			prebuilt "$@" 2>&1
		else
			"$GO" test "$@" 2>&1
		fi
		echo $? >"$logdir/lane-$name.rc"
	} | tee "$log" | sed -u "s/^/$name| /"
}

# prebuilt PKG... -- FLAGS...: the other lane's runner (above). Exits 1 if
# any package failed to build or to pass.
prebuilt() {
	local pkgs=() build=() flags=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		pkgs+=("$1")
		shift
	done
	shift
	while [ $# -gt 0 ]; do
		case $1 in
		-race | -cover | -trimpath | -tags=* | -ldflags=* | -gcflags=* | -covermode=* | -coverpkg=* | -mod=*) build+=("$1") ;;
		-tags | -ldflags | -gcflags | -covermode | -coverpkg | -mod) build+=("$1" "$2") && shift ;;
		-test.*) flags+=("$1") ;;
		-*) flags+=("-test.${1#-}") ;;
		*) flags+=("$1") ;; # the value of the flag before
		esac
		shift
	done
	local bin=$logdir/bin
	rm -rf "$bin" && mkdir -p "$bin" || return 1
	# import path and directory of each package with tests, in the lane's order
	local listed
	listed=$($GO list "${build[@]}" -f '{{.ImportPath}} {{if or .TestGoFiles .XTestGoFiles}}{{.Dir}}{{end}}' "${pkgs[@]}") || return 1
	awk 'NF == 2 {print $1}' <<<"$listed" |
		GO=$GO BIN=$bin xargs -r -P 2 -I{} bash -c 'f=$BIN/$(tr / _ <<<"$1"); "$GO" test -c -o "$f.test" "${@:2}" "$1" >"$f.build" 2>&1; echo $? >"$f.built"' _ {} "${build[@]}" &
	local status=0 pkg dir f rc t0 t
	while read -r pkg dir; do
		if [ -z "$dir" ]; then
			printf '?   \t%s\t[no test files]\n' "$pkg"
			continue
		fi
		f=$bin/$(tr / _ <<<"$pkg")
		while [ ! -s "$f.built" ]; do sleep 0.2; done
		if [ "$(cat "$f.built")" != 0 ]; then
			cat "$f.build"
			printf 'FAIL\t%s [build failed]\n' "$pkg"
			status=1
			continue
		fi
		t0=$(date +%s%N)
		(cd "$dir" && "$f.test" -test.paniconexit0 "${flags[@]}") >"$f.out" 2>&1
		rc=$?
		t=$(( ($(date +%s%N) - t0) / 1000000 ))
		t=$(printf '%d.%03ds' $((t / 1000)) $((t % 1000)))
		if [ "$rc" = 0 ]; then
			case " ${flags[*]} " in *" -test.v "* | *" -test.v=true "*) cat "$f.out" ;; esac
			printf 'ok  \t%s\t%s\n' "$pkg" "$t"
		else
			cat "$f.out"
			printf 'FAIL\t%s\t%s\n' "$pkg" "$t"
			status=1
		fi
		rm -f "$f.test"
	done <<<"$listed"
	# Every build wrote its .built file; let xargs end. Not `wait $!`: bash may
	# have reaped the pipeline by now and answer "pid is not a child of this
	# shell" (seen once in make test's output, 2026-11-28).
	wait
	[ $status = 0 ] && echo ok || echo FAIL
	return $status
}

start=$(date +%s)
lane kubelet -p 2 -tags "$tags" "$@" -timeout 40m $kube &
kpid=$!
lane other $others -- "$@" &
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
		# The failed tests and the last lines each logged from a _test.go file
		# (where t.Fatal and t.Error print; a product's log lines come first and
		# say little), so that a CI that keeps only the end of the output still
		# says what failed and why.
		awk 'function flush() { for (i = 1; i <= k; i++) print keep[i]; k = 0; n = 0 }
			/^ *--- FAIL: /{flush(); print; n = 1; next}
			n && /^ +[^ -]/{ if ($1 ~ /_test\.go:[0-9]+:$/) { if (k == 4) { for (i = 1; i < 4; i++) keep[i] = keep[i+1]; k = 3 } keep[++k] = $0 } next }
			n {flush()}
			END {flush()}' \
			"$logdir/lane-$name.log" | head -30 | cut -c1-300 | sed 's/^/   /'
	fi
done
exit $status
