package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ipledger/ipledger/internal/cniinstall"
)

// installCNI is `ipledgerd install-cni`: the DaemonSet's init container
// (deploy/ipledger.yaml). Flags only; the work is in internal/cniinstall.
func installCNI(args []string, stdout, stderr io.Writer) int {
	var o cniinstall.Options
	var plugins string
	fs := flag.NewFlagSet("ipledgerd install-cni", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.SrcDir, "src-dir", "/usr/local/bin", "directory holding the plugin binaries to install")
	fs.StringVar(&plugins, "plugins", "ipledger,ipledger-veth", "comma-separated plugin binaries to copy from --src-dir")
	fs.StringVar(&o.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the host's CNI bin dir (as mounted)")
	fs.StringVar(&o.Conflist, "conflist", "/etc/ipledger/ipledger.conflist", "conflist file to install (the ConfigMap's key)")
	fs.StringVar(&o.ConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "the host's CNI conf dir (as mounted)")
	fs.StringVar(&o.ConfName, "conf-name", "10-ipledger.conflist", "file name of the installed conflist")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ipledgerd install-cni: unexpected arguments %q\n", fs.Args())
		return 2
	}
	for _, p := range strings.Split(plugins, ",") {
		if p = strings.TrimSpace(p); p != "" {
			o.Plugins = append(o.Plugins, p)
		}
	}
	done, err := cniinstall.Install(o)
	if err != nil {
		fmt.Fprintln(stderr, "ipledgerd install-cni:", err)
		return 1
	}
	for _, f := range done.Files {
		fmt.Fprintln(stdout, "installed", f)
	}
	return 0
}
