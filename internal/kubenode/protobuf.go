package kubenode

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

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
