package kubenode

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// builtinScheme holds the only built-in kinds the agent reads and writes: Pods,
// Nodes, Namespaces and core Events (core/v1), StatefulSets (apps/v1) and
// Events (events.k8s.io/v1). client-go's typed clients register every API
// group of Kubernetes (k8s.io/client-go/kubernetes/scheme, with the whole
// clientset behind it); the agent talks to these three through REST clients
// of its own, so that the rest is not linked: that halved the agent's binary
// and took about 8 MiB off its resident memory (issue 35, the scale
// benchmark's RSS beside flanneld).
var builtinScheme = runtime.NewScheme()

// codecs decodes protobuf and JSON for builtinScheme's kinds.
var codecs serializer.CodecFactory

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, eventsv1.AddToScheme} {
		if err := add(builtinScheme); err != nil {
			panic(fmt.Sprintf("kubenode: scheme: %v", err))
		}
	}
	codecs = serializer.NewCodecFactory(builtinScheme)
}

// The API groups the REST clients speak.
var (
	coreV1   = restGroup{apiPath: "/api", gv: corev1.SchemeGroupVersion}
	appsV1   = restGroup{apiPath: "/apis", gv: appsv1.SchemeGroupVersion}
	eventsV1 = restGroup{apiPath: "/apis", gv: eventsv1.SchemeGroupVersion}
)

// restGroup is where an API group version is served.
type restGroup struct {
	apiPath string
	gv      schema.GroupVersion
}

// restClient is a REST client of group g through cfg, speaking protobuf (see
// builtinConfig), as a typed client of client-go would be configured.
func restClient(cfg *rest.Config, g restGroup) (*rest.RESTClient, error) {
	c := builtinConfig(cfg)
	gv := g.gv
	c.GroupVersion = &gv
	c.APIPath = g.apiPath
	c.NegotiatedSerializer = codecs.WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubenode: %s client: %w", g.gv, err)
	}
	return rc, nil
}

// builtinConfig is cfg for the clients of Kubernetes' built-in resources (Pods,
// Nodes, Namespaces, StatefulSets, Events): a copy that asks the apiserver for
// protobuf, as the kubelet and kube-proxy do, and still takes JSON from a
// server that answers with it. The agent's CPU profile during a burst of 500
// pods on three nodes (issue 35) spent a quarter of its samples decoding the
// pod watch's JSON. ipledger's own resources (CRDs, the dynamic client of
// kubeds) have no protobuf form and keep JSON.
func builtinConfig(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return c
}
