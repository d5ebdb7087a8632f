package clusterconf

import (
	"context"
	"errors"

	"github.com/ipledger/ipledger/internal/datastore"
)

// openEtcd connects to etcd (waiting for the etcd backend, internal/datastore/etcdds).
func (c *Config) openEtcd(context.Context) (datastore.Store, error) {
	return nil, errors.New("--datastore etcd: not built yet")
}
