# Go 1.26: from PATH, else where this project's machines have it (/usr/local/go). The
# tests run `go build` themselves, so the PATH is exported to them as well.
export PATH := $(PATH):/usr/local/go/bin
GO      ?= go
BIN     := bin
BINS    := ipledger ipledger-veth ipledgerd ipledgerctl kubectl-ipledger portmap
# kubectl-ipledger: the kubectl plugin (a client tool; the image does not carry it).
# portmap: the standard CNI port-mapping plugin (hostPort), built from the source of
# go.mod's containernetworking/plugins (a tool of the module) and shipped beside ours.
PORTMAP := github.com/containernetworking/plugins/plugins/meta/portmap
CNI_PLUGINS_VERSION = $(shell $(GO) list -m -f '{{.Version}}' github.com/containernetworking/plugins)
# make bench measures the scale benchmark's systems this many times each (see bench).
IPLEDGER_SCALE_ROUNDS ?= 2
# Tests build the binaries themselves; keep the whole suite well under 30 minutes.
TESTFLAGS ?= -count=1 -timeout 25m

.PHONY: all build image manifests test deps bench bench-smoke demo lint fuzz clean conformance runtime-matrix

all: build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath \
		-ldflags='-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$(CNI_PLUGINS_VERSION)' \
		-o $(BIN)/ ./cmd/... $(PORTMAP)

# image: bin/ipledger-image.tar, a docker-archive tagged ipledger:dev holding the
# four static binaries and portmap; built in Go (internal/image), no Docker, no network,
# fixed timestamps (two builds are byte-identical). Load it with
# `ctr -n k8s.io images import bin/ipledger-image.tar`.
IMAGE_TAG ?= ipledger:dev
image: build
	$(GO) run ./tools/image --bin $(BIN) --out $(BIN)/ipledger-image.tar --tag $(IMAGE_TAG)

# manifests: deploy/cluster/ipledger.yaml and deploy/dualstack/ipledger.yaml, the copies
# of deploy/ipledger.yaml that the cluster-mode and dual-stack overlays
# (kubectl apply -k deploy/cluster, deploy/dualstack) build on.
manifests:
	cp deploy/ipledger.yaml deploy/cluster/ipledger.yaml
	cp deploy/ipledger.yaml deploy/dualstack/ipledger.yaml

deps:
	./scripts/install-deps.sh

# KUBELET_PKGS: the packages whose tests start a kubelet cluster (kubeenv.Start,
# StartControlPlane, directly or through nodesenv, onenode or e2eenv). Every such
# cluster holds the host-wide lock /var/cache/ipledger/kube/.cluster.lock until its
# test process exits, so they run one after the other. internal/testenv's
# TestKubeletLaneIsComplete fails when a package starts a cluster and is not here.
KUBELET_PKGS = ./internal/testenv/kubeenv ./test/kube ./test/kubenodes ./test/kubeupstream \
	./test/kubewitness
export KUBELET_PKGS
# KUBELET_TAGS: the build tag of the test files that start a kubelet cluster. A plain
# `go test ./...` (Go's defaults: two packages at a time, ten minutes each) leaves them
# out, as one three-node scenario alone takes longer than ten minutes on 2 cores; the
# kubelet lane of make test, make bench, conformance and runtime-matrix pass it.
KUBELET_TAGS = kubelet
export KUBELET_TAGS

# Installs what the tests need (Debian packages, Go modules) and runs every test in
# two lanes at the same time (scripts/test-lanes.sh): KUBELET_PKGS one at a time, and
# every other package one at a time beside them. Both stream to the terminal, prefixed
# "kubelet| " and "other| ", and to test-artifacts/lane-*.log; the run ends with each
# lane's verdict and the packages that failed, and fails if either lane failed.
# Test artifacts (the pool page's screenshots from headless chromium) are kept under
# test-artifacts/_artifacts/<one directory per test>/ (the test logs the path).
test: deps build
	$(GO) vet ./...
	$(GO) vet -tags $(KUBELET_TAGS),conformance $(KUBELET_PKGS)
	@mkdir -p test-artifacts
	GO=$(GO) ./scripts/test-lanes.sh $(CURDIR)/test-artifacts $(TESTFLAGS) -artifacts -outputdir $(CURDIR)/test-artifacts

bench: deps build
	$(GO) run ./test/benchcmd -v --bin $(BIN) --out bench-results.md
	@# Pod startup under a real kubelet (test/kube), ipledger vs bridge + host-local: minutes.
	$(GO) test -tags $(KUBELET_TAGS) -run '^$$' -bench '^BenchmarkPodStartup$$' -benchtime 1x -timeout 30m -v ./test/kube > $(BIN)/kube-bench.log 2>&1 \
		|| { tail -40 $(BIN)/kube-bench.log; exit 1; }
	grep -E '^\s+bench_test.go|^\s*\||^BenchmarkPodStartup' $(BIN)/kube-bench.log | sed -E 's/^\s+(bench_test.go:[0-9]+: )?//' | tee -a bench-results.md
	@# ipledger vs flannel host-gw on three kubelet nodes (test/kubenodes), one after the
	@# other in one run: connectivity, 300 pods' startup, routes as Nodes join and leave,
	@# the agents' CPU and memory at 3 and 100 Nodes: tens of minutes on 2 cores.
	$(GO) test -tags $(KUBELET_TAGS) -run '^$$' -bench '^BenchmarkFlannel$$' -benchtime 1x -timeout 90m -v ./test/kubenodes > $(BIN)/flannel-bench.log 2>&1 \
		|| { tail -40 $(BIN)/flannel-bench.log; exit 1; }
	grep -E '^\s*\||^BenchmarkFlannel|bench_test.go:[0-9]+: (cluster of|ipledger measured|flannel measured|benchmark took|(ipledger|flannel): [0-9]+ pods)' $(BIN)/flannel-bench.log | sed -E 's/^\s+(bench_test.go:[0-9]+: )?//' | tee -a bench-results.md
	@# Spiderpool's shape (issue 35): IPLEDGER_SCALE_DEPLOYMENTS (default 50) Deployments x 10
	@# replicas at once on the three kubelet nodes (maxPods 250), for ipledger node mode, cluster
	@# mode on the Kubernetes API and on etcd, and flannel host-gw: 5 to 25 min a system on 2 cores
	@# (machines differ), half of it the teardown. IPLEDGER_SCALE_ROUNDS (2 here) measures each that
	@# many times, every second round in the reverse order, and pools the rounds: one round's
	@# timings move with its position by more than the networks differ (docs/benchmarks.md).
	@# The pod network's own share, containerd's timer around each CNI ADD and DEL, moves less.
	@# A smoke size: IPLEDGER_SCALE_DEPLOYMENTS=6 IPLEDGER_SCALE_ROUNDS=1.
	@# IPLEDGER_SCALE_PPROF=DIR adds the agents' CPU profiles.
	IPLEDGER_SCALE_ROUNDS=$(IPLEDGER_SCALE_ROUNDS) $(GO) test -tags $(KUBELET_TAGS) -run '^$$' -bench '^BenchmarkScale$$' -benchtime 1x -timeout 180m -v ./test/kubenodes > $(BIN)/scale-bench.log 2>&1 \
		|| { tail -40 $(BIN)/scale-bench.log; exit 1; }
	grep -E '^\s*\||^BenchmarkScale|scale_test.go:[0-9]+: (cluster of|[a-z]+ measured|benchmark took|[a-z]+: [0-9]+ pods|round [0-9]+ of|the [0-9]+ rounds pooled)' $(BIN)/scale-bench.log | sed -E 's/^\s+(scale_test.go:[0-9]+: )?//' | tee -a bench-results.md

# conformance: Kubernetes' own network e2e tests (e2e.test built from the pinned
# release) on three nodes with ipledger installed from deploy/, in node mode and then
# in cluster mode; writes each mode's summary to docs/conformance.md. Long (see that
# file for how long); `make test` runs a small subset of it (TestUpstreamNetworkSubset).
# CONFORMANCE_ARGS: e.g. -conformance.modes=node, or a focus quoted inside the variable
# (the shell splits it): CONFORMANCE_ARGS="'-conformance.focus=KubeProxy should'";
# '-conformance.modes=node -conformance.dualstack': the IPv4/IPv6 dual-stack run.
CONFORMANCE_ARGS ?=
conformance: deps build
	$(GO) test -tags $(KUBELET_TAGS),conformance -count=1 -timeout 4h -run '^TestConformance$$' -v ./test/kubenodes -args $(CONFORMANCE_ARGS)

# runtime-matrix: test/kube's seed 001, containerd#10744, seed 004 and churn scenarios
# under a real kubelet on each containerd of MATRIX_RUNTIMES in turn (one cluster
# each; host-local as the control in the same run), then the table of their cells
# into docs/runtimes.md. A runtime whose run fails still leaves the cells it wrote;
# the target fails at the end. Long: about 15 minutes a runtime on 2 cores.
MATRIX_RUNTIMES ?= debian 1.7.30 2.2.1 2.3.7
MATRIX_CELLS    ?= $(CURDIR)/$(BIN)/runtime-matrix.jsonl
runtime-matrix: deps build
	@rm -f $(MATRIX_CELLS)
	@status=0; for v in $(MATRIX_RUNTIMES); do \
		echo "== containerd $$v"; \
		IPLEDGER_CONTAINERD=$$v IPLEDGER_MATRIX_OUT=$(MATRIX_CELLS) $(GO) test -tags $(KUBELET_TAGS) -count=1 -timeout 60m -v \
			-run '^TestKubernetesNode$$/^(Churn|Seed004ContainerdRestarts|Seed001ChainedTeardownFails|Issue10744TeardownSkipped)$$' \
			./test/kube > $(BIN)/runtime-matrix-$$v.log 2>&1 || { status=1; tail -40 $(BIN)/runtime-matrix-$$v.log; }; \
		grep -E -- '^\s*--- (PASS|FAIL)' $(BIN)/runtime-matrix-$$v.log; \
	done; \
	$(GO) run ./test/kube/matrixdoc -in $(MATRIX_CELLS) -doc docs/runtimes.md; \
	exit $$status

# bench: the whole benchmark in one run (as root, minutes): a Markdown table of
# ipledger vs host-local/ptp vs the exec floor on stdout and in bench-results.md.
# bench-smoke: the same with small counts (seconds), so the harness never rots.
bench-smoke: build
	$(GO) run ./test/benchcmd --smoke --bin $(BIN)

# demo: installs what it needs, then the real-containerd demo with the seed faults,
# ipledger's and host-local's books side by side, and a short simulator table.
demo: deps build
	./scripts/demo.sh

lint:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt would change the files above" >&2; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags $(KUBELET_TAGS),conformance $(KUBELET_PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags $(KUBELET_TAGS),conformance ./...

# fuzz: each parser's fuzz target for FUZZTIME (go test fuzzes one target per run).
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseRangeSets$$' -fuzztime $(FUZZTIME) ./internal/pool
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./internal/ipam
	$(GO) test -run '^$$' -fuzz '^FuzzPodArgs$$' -fuzztime $(FUZZTIME) ./internal/ipam
	$(GO) test -run '^$$' -fuzz '^FuzzFromConflist$$' -fuzztime $(FUZZTIME) ./internal/ipam
	$(GO) test -run '^$$' -fuzz '^FuzzConfigVersion$$' -fuzztime $(FUZZTIME) ./internal/cniplugin
	$(GO) test -run '^$$' -fuzz '^FuzzVersionsMatchLibrary$$' -fuzztime $(FUZZTIME) ./internal/cniplugin
	$(GO) test -run '^$$' -fuzz '^FuzzValidatorsMatchLibrary$$' -fuzztime $(FUZZTIME) ./internal/cniplugin
	$(GO) test -run '^$$' -fuzz '^FuzzParseReservation$$' -fuzztime $(FUZZTIME) ./internal/cluster

clean:
	rm -rf $(BIN) test-artifacts
