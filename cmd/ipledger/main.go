// Command ipledger is the CNI IPAM plugin: a thin client of ipledgerd.
package main

import (
	"os"

	"github.com/ipledger/ipledger/internal/cniplugin"
	"github.com/ipledger/ipledger/internal/ipam"
)

func main() {
	os.Exit(ipam.New().Main(cniplugin.OS()))
}
