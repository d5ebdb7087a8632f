package kubenode_test

import (
	"testing"

	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestOnOneAPIServer runs the watches' tests against one real kube-apiserver
// (starting one costs about 25 s on a loaded 2-core machine, the tests a few
// seconds each). Every subtest starts from a server emptied of what the ones
// before made: no Node, no Pod, no Event, no namespace but the server's own.
// The tests that stop or restart the server start their own.
func TestOnOneAPIServer(t *testing.T) {
	api := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *kubeenv.APIServer)
	}{
		{"NodeWatch", nodeWatch},
		{"OffLinkEvent", offLinkEvent},
		{"EventSeries", eventSeries},
		{"PodWatch", podWatch},
		{"PodChoices", podChoices},
		{"BuiltinWatchesSpeakProtobuf", builtinWatchesSpeakProtobuf},
		{"NamespaceChoicesFromTheWatch", kubenode.NamespaceChoicesFromTheWatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api.Empty(t)
			tc.run(t, api)
		})
	}
}
