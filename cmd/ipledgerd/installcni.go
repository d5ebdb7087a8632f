package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ipledger/ipledger/internal/cniinstall"
	"github.com/ipledger/ipledger/internal/cri"
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
	fs.StringVar(&o.CNIVersion, "cni-version", cniinstall.VersionAuto, "the installed conflist's cniVersion: auto (the newest the runtime at --cri-endpoint loads: 1.1.0 on containerd 2.0.1+ and CRI-O 1.32+, where the runtime calls STATUS and a Node follows the agent's readiness; else 1.0.0), keep (the conflist's own), or 1.1.0 or 1.0.0 (checked against the runtime)")
	endpoint := fs.String("cri-endpoint", "unix:///run/containerd/containerd.sock", "the node's CRI socket, asked for the runtime's name and version (Version call); empty: not asked (auto keeps the conflist's cniVersion)")
	if code := parseFlags(fs, args, stderr); code >= 0 {
		return code
	}
	o.Plugins, o.Shared = splitList(plugins), splitList(shared)
	if *endpoint != "" {
		rt, err := askRuntime(*endpoint)
		switch {
		case err == nil:
			o.Runtime = rt
		case o.CNIVersion == cniinstall.VersionAuto || o.CNIVersion == "":
			fmt.Fprintf(stderr, "ipledgerd install-cni: --cni-version auto needs the runtime's version: %v; mount the runtime's socket or give --cni-version\n", err)
			return 1
		default:
			fmt.Fprintf(stderr, "ipledgerd install-cni: cniVersion %s not checked against the runtime: %v\n", o.CNIVersion, err)
		}
	}
	done, err := cniinstall.Install(o)
	if err != nil {
		fmt.Fprintln(stderr, "ipledgerd install-cni:", err)
		return 1
	}
	fmt.Fprintf(stdout, "cniVersion %s: %s\n", done.CNIVersion, done.CNIVersionReason)
	for _, f := range done.Files {
		fmt.Fprintln(stdout, "installed", f)
	}
	for _, p := range done.Kept {
		fmt.Fprintf(stdout, "kept %s: the node's own, not installed by ipledger\n", p)
	}
	fmt.Fprintln(stdout, "recorded in", done.Record)
	return 0
}

// askRuntime asks the CRI runtime at endpoint for its name and version.
func askRuntime(endpoint string) (*cniinstall.RuntimeInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cri.Dial(ctx, endpoint, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	v, err := c.Version(ctx)
	if err != nil {
		return nil, err
	}
	return &cniinstall.RuntimeInfo{Name: v.Name, Version: v.Version}, nil
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
