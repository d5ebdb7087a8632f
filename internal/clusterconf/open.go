package clusterconf

import (
	"context"
	"errors"
	"fmt"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
)

// Open connects to the datastore c describes. It does not wait for the datastore to
// answer: an agent starts while its datastore is away and serves from what it can
// prove.
func (c *Config) Open(ctx context.Context) (datastore.Store, error) {
	switch c.Datastore {
	case Kubernetes:
		rc, err := kubeds.LoadConfig(c.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
		return kubeds.New(rc, kubeds.Options{Namespace: c.KubeNamespace})
	case Etcd:
		return c.openEtcd(ctx)
	case None:
		return nil, errors.New("--datastore none: node mode has no datastore")
	}
	return nil, fmt.Errorf("--datastore %q: use kubernetes, etcd or none", c.Datastore)
}
