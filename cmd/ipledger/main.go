// Command ipledger is the CNI IPAM plugin: a thin client of ipledgerd.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ipledger/ipledger/internal/ipam"
)

func main() {
	skel.PluginMainFuncs(ipam.New().Funcs(), ipam.Versions, "ipledger: IPAM plugin, a client of ipledgerd")
}
