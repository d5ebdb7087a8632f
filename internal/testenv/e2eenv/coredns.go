package e2eenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/image"
	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/buildcache"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// CoreDNSVersion is the CoreDNS kubeadm of kubeenv.Version deploys
// (cmd/kubeadm/app/constants CoreDNSVersion).
var CoreDNSVersion = kubeenv.Current.CoreDNS

// CoreDNSRef is the image reference the cluster's DNS Deployment names.
var CoreDNSRef = "registry.k8s.io/coredns/coredns:" + CoreDNSVersion

// coreDNSDir caches the CoreDNS build: beside kubeenv's cache, by version.
func coreDNSDir() string {
	return filepath.Join(filepath.Dir(kubeenv.CacheDir()), "coredns", CoreDNSVersion)
}

// coreDNSRecipe builds coredns from its Go module at CoreDNSVersion (no
// cgo). Its key (module, version, toolchain) is the one the cache was
// stamped with before.
func coreDNSRecipe() buildcache.Recipe {
	const module = "github.com/coredns/coredns"
	return buildcache.Recipe{
		Name: "coredns", Version: CoreDNSVersion,
		Dir:     coreDNSDir(),
		Key:     []string{module + "@" + CoreDNSVersion, buildcache.Toolchain()},
		Outputs: []string{"coredns"},
		Cold:    4 * time.Minute,
		Build: func(src, out string) error {
			if err := buildcache.WriteModule(src, buildcache.ModFile("corednsbuild", "")); err != nil {
				return err
			}
			if _, err := buildcache.Go(src, nil, "get", module+"@"+CoreDNSVersion); err != nil {
				return err
			}
			_, err := buildcache.Go(src, nil, "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(out, "coredns"), module)
			return err
		},
	}
}

// CoreDNS returns the path of the coredns binary, built from its Go module at
// CoreDNSVersion once per machine and cached by version and Go toolchain
// (buildcache). Under -short it skips tb.
func CoreDNS(tb testing.TB) string {
	tb.Helper()
	testenv.SkipIfShort(tb, "needs a CoreDNS build")
	r := coreDNSRecipe()
	if _, err := buildcache.Ensure(r, tb.Logf); err != nil {
		tb.Fatal(err)
	}
	return r.Path("coredns")
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
