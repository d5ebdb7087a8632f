package e2eenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/image"
	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// CoreDNSVersion is the CoreDNS kubeadm of kubeenv.Version deploys
// (cmd/kubeadm/app/constants CoreDNSVersion).
const CoreDNSVersion = "v1.14.2"

// CoreDNSRef is the image reference the cluster's DNS Deployment names.
const CoreDNSRef = "registry.k8s.io/coredns/coredns:" + CoreDNSVersion

// coreDNSDir caches the CoreDNS build: beside kubeenv's cache, by version.
func coreDNSDir() string {
	return filepath.Join(filepath.Dir(kubeenv.CacheDir()), "coredns", CoreDNSVersion)
}

func coreDNSKey() string {
	h := sha256.Sum256([]byte("github.com/coredns/coredns@" + CoreDNSVersion + "\x00" + runtime.Version()))
	return hex.EncodeToString(h[:])[:16]
}

// CoreDNS returns the path of the coredns binary, built from its Go module at
// CoreDNSVersion (no cgo) once per machine and cached by version and Go
// toolchain, under a lock. Under -short it skips tb.
func CoreDNS(tb testing.TB) string {
	tb.Helper()
	testenv.SkipIfShort(tb, "needs a CoreDNS build")
	dir := coreDNSDir()
	bin := filepath.Join(dir, "bin", "coredns")
	stamp := filepath.Join(dir, "bin", ".stamp")
	valid := func() bool {
		b, err := os.ReadFile(stamp)
		fi, serr := os.Stat(bin)
		return err == nil && strings.TrimSpace(string(b)) == coreDNSKey() && serr == nil && fi.Size() > 0
	}
	if valid() {
		return bin
	}
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		tb.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		tb.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if valid() {
		return bin
	}
	t0 := time.Now()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module ipledger.test/corednsbuild\n\ngo 1.26.0\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "doc.go"), []byte("// Package corednsbuild only pins the module coredns is built from.\npackage corednsbuild\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	tmp := filepath.Join(dir, "bin.tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		tb.Fatal(err)
	}
	for _, args := range [][]string{
		{"get", "github.com/coredns/coredns@" + CoreDNSVersion},
		{"build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(tmp, "coredns"), "github.com/coredns/coredns"},
	} {
		cmd := exec.Command(goBin(), args...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off", "GOTOOLCHAIN=local")
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("e2eenv: go %s: %v\n%s", strings.Join(args, " "), err, tailString(string(out), 30))
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, ".stamp"), []byte(coreDNSKey()+"\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	os.RemoveAll(filepath.Join(dir, "bin"))
	if err := os.Rename(tmp, filepath.Join(dir, "bin")); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("e2eenv: built coredns %s in %v", CoreDNSVersion, time.Since(t0).Round(time.Second))
	return bin
}

func goBin() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

func tailString(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// CoreDNSImage writes the CoreDNS image (the binary alone, as upstream's
// distroless image is) into dir and returns its docker archive.
func CoreDNSImage(tb testing.TB, dir string) string {
	tb.Helper()
	data, err := os.ReadFile(CoreDNS(tb))
	if err != nil {
		tb.Fatal(err)
	}
	p := filepath.Join(dir, "coredns.tar")
	spec := image.Spec{Tag: CoreDNSRef, Files: append([]image.File{{Path: "coredns", Mode: 0o755, Data: data}}, etcFiles...),
		Dirs: []string{"tmp"}, Entrypoint: []string{"/coredns"}}
	if err := image.WriteFile(spec, p); err != nil {
		tb.Fatal(err)
	}
	return p
}

// CoreDNSManifest is the cluster DNS as kubeadm deploys it (its addons/dns
// phase): the kube-dns Service on kubeenv.DNSServiceIP, a coredns Deployment
// of two replicas spread over the nodes reading the Corefile from a
// ConfigMap, and the RBAC it needs to watch Services, EndpointSlices, Pods
// and Namespaces.
var CoreDNSManifest = fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
  - {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health {
           lameduck 5s
        }
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {
           pods insecure
           fallthrough in-addr.arpa ip6.arpa
           ttl 30
        }
        prometheus :9153
        forward . /etc/resolv.conf {
           max_concurrent 1000
        }
        cache 30 {
           disable success cluster.local
           disable denial cluster.local
        }
        loop
        reload
        loadbalance
    }
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/cluster-service: "true", kubernetes.io/name: CoreDNS}
spec:
  clusterIP: %[1]s
  selector: {k8s-app: kube-dns}
  ports:
    - {name: dns, port: 53, protocol: UDP, targetPort: 53}
    - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
    - {name: metrics, port: 9153, protocol: TCP, targetPort: 9153}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 2
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      priorityClassName: system-cluster-critical
      serviceAccountName: coredns
      dnsPolicy: Default
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                labelSelector: {matchLabels: {k8s-app: kube-dns}}
                topologyKey: kubernetes.io/hostname
      containers:
        - name: coredns
          image: %[2]s
          imagePullPolicy: Never
          args: ["-conf", "/etc/coredns/Corefile"]
          resources:
            limits: {memory: 170Mi}
            requests: {cpu: 100m, memory: 70Mi}
          ports:
            - {containerPort: 53, name: dns, protocol: UDP}
            - {containerPort: 53, name: dns-tcp, protocol: TCP}
            - {containerPort: 9153, name: metrics, protocol: TCP}
            - {containerPort: 8080, name: liveness-probe, protocol: TCP}
            - {containerPort: 8181, name: readiness-probe, protocol: TCP}
          livenessProbe:
            httpGet: {path: /health, port: liveness-probe}
            initialDelaySeconds: 60
            timeoutSeconds: 5
            failureThreshold: 5
          readinessProbe:
            httpGet: {path: /ready, port: readiness-probe}
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
            readOnlyRootFilesystem: true
          volumeMounts:
            - {name: config-volume, mountPath: /etc/coredns, readOnly: true}
      volumes:
        - name: config-volume
          configMap:
            name: coredns
            items: [{key: Corefile, path: Corefile}]
`, kubeenv.DNSServiceIP, CoreDNSRef)
