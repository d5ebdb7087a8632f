// Command ipledger is the CNI IPAM plugin: a thin client of ipledgerd.
package main

import (
	"os"

	"github.com/ipledger/ipledger/internal/cniplugin"
	"github.com/ipledger/ipledger/internal/ipam"
)

func main() {
	os.Exit(cniplugin.Main(cniplugin.OS(), ipam.New().Funcs(), ipam.Versions, "ipledger: IPAM plugin, a client of ipledgerd"))
}
