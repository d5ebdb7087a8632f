package kubenode_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// exchange is one request the agent's clients sent, as the proxy saw it.
type exchange struct {
	path, accept, contentType string
}

// builtinWatchesSpeakProtobuf: the Node and Pod caches list and watch in
// protobuf, through a proxy in front of a real kube-apiserver that records
// what each request asked for and what came back, and still build their
// caches from it.
func builtinWatchesSpeakProtobuf(t *testing.T, api *kubeenv.APIServer) {
	target, err := url.Parse(api.Config().Host)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rest.TransportFor(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []exchange
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = tr
	proxy.FlushInterval = -1 // watches stream
	proxy.ModifyResponse = func(r *http.Response) error {
		mu.Lock()
		seen = append(seen, exchange{r.Request.URL.Path, r.Request.Header.Get("Accept"), r.Header.Get("Content-Type")})
		mu.Unlock()
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	cfg := &rest.Config{Host: srv.URL}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	w, err := kubenode.New(cfg, "node-a", logger(t))
	if err != nil {
		t.Fatal(err)
	}
	w.Run(ctx)
	pods, err := kubenode.NewPods(cfg, "node-a", nil, logger(t))
	if err != nil {
		t.Fatal(err)
	}
	pods.Run(ctx)
	if !w.WaitSynced(ctx) || !pods.WaitSynced(ctx) {
		t.Fatal("the Node and Pod caches did not list through the proxy within 60s")
	}
	got := map[string]int{}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range seen {
		if e.path != "/api/v1/nodes" && e.path != "/api/v1/pods" {
			continue
		}
		got[e.path]++
		if !strings.HasPrefix(e.accept, runtime.ContentTypeProtobuf) {
			t.Errorf("%s asked for %q, want protobuf first", e.path, e.accept)
		}
		if !strings.HasPrefix(e.contentType, runtime.ContentTypeProtobuf) {
			t.Errorf("%s answered %q, want protobuf", e.path, e.contentType)
		}
	}
	if got["/api/v1/nodes"] == 0 || got["/api/v1/pods"] == 0 {
		t.Fatalf("requests seen: %v; want the Node and Pod lists among them", seen)
	}
}

// BenchmarkPodDecode: the cost of one Pod as the agent's pod watch reads it,
// in JSON (before builtinConfig) and in protobuf, for a Running pod of a
// Deployment as the scale benchmark makes them.
func BenchmarkPodDecode(b *testing.B) {
	pod := benchPod()
	codecs := serializer.NewCodecFactory(scheme.Scheme)
	for _, mt := range []string{runtime.ContentTypeJSON, runtime.ContentTypeProtobuf} {
		info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mt)
		if !ok {
			b.Fatalf("no serializer for %s", mt)
		}
		enc := codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
		data, err := runtime.Encode(enc, pod)
		if err != nil {
			b.Fatal(err)
		}
		dec := codecs.DecoderToVersion(info.Serializer, corev1.SchemeGroupVersion)
		name := strings.TrimPrefix(mt, "application/")
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := runtime.Decode(dec, data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchPod is a Running, Ready pod of a Deployment with one container.
func benchPod() *corev1.Pod {
	now := metav1.Now()
	t := true
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "dep-007-fdc79647d-585pq", Namespace: "scale-node-0", UID: "80d95dc1-7d4a-4649-b0c4-496f5aeb520d",
			ResourceVersion: "123456", GenerateName: "dep-007-fdc79647d-", CreationTimestamp: now,
			Labels: map[string]string{"app": "dep-007", "pod-template-hash": "fdc79647d"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "dep-007-fdc79647d",
				UID: "7f555e70-3010-43e3-9d84-50dfe14598a1", Controller: &t, BlockOwnerDeletion: &t}}},
		Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "sleep", Image: "busybox:1.36",
			Command: []string{"/bin/busybox", "sleep", "3600"}, ImagePullPolicy: corev1.PullNever,
			TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile}},
			RestartPolicy: corev1.RestartPolicyAlways, DNSPolicy: corev1.DNSClusterFirst, SchedulerName: "default-scheduler",
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.250.0.12", PodIP: "10.236.1.77",
			PodIPs: []corev1.PodIP{{IP: "10.236.1.77"}}, StartTime: &now, QOSClass: corev1.PodQOSBestEffort,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "sleep", Ready: true, Image: "docker.io/library/busybox:1.36",
				ImageID:     "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
				ContainerID: "containerd://f824318ed4ba9f704dc924b103ee7f15a0100f44567e38fdca435f35b325b1d6",
				State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}},
	}
}
