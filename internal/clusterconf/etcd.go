package clusterconf

import (
	"context"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/etcdds"
)

// openEtcd connects to etcd; etcdds does not wait for a member to answer.
func (c *Config) openEtcd(context.Context) (datastore.Store, error) {
	return etcdds.New(etcdds.Config{Endpoints: c.EtcdEndpoints, CAFile: c.EtcdCA, CertFile: c.EtcdCert, KeyFile: c.EtcdKey})
}
