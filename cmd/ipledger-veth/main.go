// Command ipledger-veth is the ipledger routed-veth CNI main plugin. Wiring only;
// the plugin is internal/veth.
package main

import (
	"log/slog"
	"os"
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ipam"
	"github.com/ipledger/ipledger/internal/veth"
)

func init() {
	// Keep main on the thread group leader; netlink handles for the pod namespace
	// switch a locked thread only while opening their socket.
	runtime.LockOSThread()
}

func main() {
	p := &veth.Plugin{
		Stdout: os.Stdout,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		IPAM:   &veth.AgentIPAM{Exec: &veth.ExecIPAM{Stderr: os.Stderr}, Call: api.Call, NetNS: ipam.NetNSID},
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status},
		veth.SupportedVersions, "ipledger-veth: ipledger routed-veth CNI plugin")
}
