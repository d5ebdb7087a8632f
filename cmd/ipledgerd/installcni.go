package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ipledger/ipledger/internal/cniinstall"
	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
)

// installCNI is `ipledgerd install-cni`: the DaemonSet's init container
// (deploy/ipledger.yaml). Flags only; the work is in internal/cniinstall.
func installCNI(args []string, stdout, stderr io.Writer) int {
	var o cniinstall.Options
	var plugins, shared string
	fs := flag.NewFlagSet("ipledgerd install-cni", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.SrcDir, "src-dir", "/usr/local/bin", "directory holding the plugin binaries to install")
	fs.StringVar(&plugins, "plugins", "ipledger,ipledger-veth", "comma-separated plugin binaries to copy from --src-dir")
	fs.StringVar(&shared, "shared-plugins", "portmap", "comma-separated plugins other networks may use too, copied from --src-dir only where --cni-bin-dir has none (or the one there was installed by install-cni)")
	cniFlags(fs, &o)
	fs.StringVar(&o.Conflist, "conflist", "/etc/ipledger/ipledger.conflist", "conflist file to install (the ConfigMap's key)")
	if code := parseFlags(fs, args, stderr); code >= 0 {
		return code
	}
	o.Plugins, o.Shared = splitList(plugins), splitList(shared)
	done, err := cniinstall.Install(o)
	if err != nil {
		fmt.Fprintln(stderr, "ipledgerd install-cni:", err)
		return 1
	}
	for _, f := range done.Files {
		fmt.Fprintln(stdout, "installed", f)
	}
	for _, p := range done.Kept {
		fmt.Fprintf(stdout, "kept %s: the node's own, not installed by ipledger\n", p)
	}
	fmt.Fprintln(stdout, "recorded in", done.Record)
	return 0
}

// uninstallCNI is `ipledgerd uninstall-cni`: install-cni's reverse. It removes the
// conflist and the plugins install-cni installed (by its record; without one, the
// --plugins), and leaves the ledger (--state-dir of the agent) alone.
func uninstallCNI(args []string, stdout, stderr io.Writer) int {
	var o cniinstall.Options
	var plugins string
	var network bool
	fs := flag.NewFlagSet("ipledgerd uninstall-cni", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&plugins, "plugins", "ipledger,ipledger-veth", "comma-separated plugin binaries to remove even where install-cni's record does not name them")
	fs.BoolVar(&network, "network", true, "also remove the node network of this network namespace: every route of ipledger's route protocol, the nftables table inet ipledger (masquerade) and the FORWARD accepts (chain IPLEDGER-FWD)")
	cniFlags(fs, &o)
	if code := parseFlags(fs, args, stderr); code >= 0 {
		return code
	}
	o.Plugins = splitList(plugins)
	if network {
		o.Cleanups = append(o.Cleanups, func() error {
			h, err := netlink.NewHandle()
			if err != nil {
				return fmt.Errorf("netlink: %w", err)
			}
			defer h.Close()
			n, err := routes.New(h).Remove()
			fmt.Fprintf(stdout, "removed %d routes of protocol %d (ipledger's)\n", n, routes.Protocol)
			return err
		}, func() error {
			if err := masq.New(netns.None()).Remove(); err != nil {
				return err
			}
			fmt.Fprintln(stdout, "removed the nftables table inet ipledger (masquerade), if there was one")
			return nil
		}, func() error {
			removed, err := masq.NewForward(netns.None()).Remove()
			if err != nil {
				return err
			}
			if removed {
				fmt.Fprintln(stdout, "removed the FORWARD accepts of the pod ranges (chain "+masq.ForwardChain+")")
			}
			return nil
		})
	}
	done, err := cniinstall.Uninstall(o)
	for _, f := range done.Removed {
		fmt.Fprintln(stdout, "removed", f)
	}
	if err != nil {
		fmt.Fprintln(stderr, "ipledgerd uninstall-cni:", err)
		return 1
	}
	return 0
}

// cniFlags are the host's CNI directories, the same for install and uninstall.
func cniFlags(fs *flag.FlagSet, o *cniinstall.Options) {
	fs.StringVar(&o.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the host's CNI bin dir (as mounted)")
	fs.StringVar(&o.ConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "the host's CNI conf dir (as mounted)")
	fs.StringVar(&o.ConfName, "conf-name", "10-ipledger.conflist", "file name of the installed conflist")
}

// parseFlags parses args; -1 means go on, else the exit status.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) int {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return 2
	}
	return -1
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
