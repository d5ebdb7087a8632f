package containerdenv

import (
	"fmt"
	"strings"
)

// Config is what a private containerd's config.toml says, whatever its
// version: Render writes it in the shape that version reads.
type Config struct {
	Root, State, Socket string
	// Sandbox is the pause image reference.
	Sandbox string
	// Snapshotter of the CRI plugin (overlayfs or native).
	Snapshotter string
	// RuncRoot is runc's state root; empty: runc's default.
	RuncRoot string
	// CNIBinDir and CNIConfDir: the one plugin directory and the conflist
	// directory (max_conf_num is 1: the lowest file name is the network).
	CNIBinDir, CNIConfDir string
	// NetnsUnderState puts the pods' netns bind mounts under State instead
	// of /run/netns.
	NetnsUnderState bool
	// OptDir is the opt plugin's directory; empty: Root/opt.
	OptDir   string
	LogLevel string
	// MetricsAddress is where containerd serves Prometheus metrics
	// (/v1/metrics on host:port); empty: none.
	MetricsAddress string
}

// disabledPlugins are left out of every private containerd: snapshotters
// that cannot work here, tracing, and NRI (its socket would be the host's
// /var/run/nri/nri.sock, shared by every env).
var disabledPlugins = []string{
	"io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
	"io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
	"io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
	"io.containerd.nri.v1.nri",
}

// Render writes c as the config.toml of containerd release major (1:
// containerd 1.6 and 1.7, config version 2 with the one CRI plugin
// io.containerd.grpc.v1.cri; 2: containerd 2.x, config version 3 with the
// CRI runtime and images plugins io.containerd.cri.v1.runtime and
// io.containerd.cri.v1.images, the server settings left in
// io.containerd.grpc.v1.cri).
func (c Config) Render(major int) string {
	opt := c.OptDir
	if opt == "" {
		opt = c.Root + "/opt"
	}
	level := c.LogLevel
	if level == "" {
		level = "info"
	}
	var b strings.Builder
	version := 2
	if major >= 2 {
		version = 3
	}
	fmt.Fprintf(&b, "version = %d\nroot = %q\nstate = %q\noom_score = 0\n", version, c.Root, c.State)
	fmt.Fprintf(&b, "disabled_plugins = [%s]\n\n", quoteAll(disabledPlugins))
	fmt.Fprintf(&b, "[grpc]\n  address = %q\n[ttrpc]\n  address = \"\"\n[debug]\n  address = \"\"\n  level = %q\n[metrics]\n  address = %q\n\n", c.Socket, level, c.MetricsAddress)
	fmt.Fprintf(&b, "[plugins.\"io.containerd.internal.v1.opt\"]\n  path = %q\n\n", opt)
	const server = `plugins."io.containerd.grpc.v1.cri"`
	runtime, images := server, server
	if major >= 2 {
		runtime, images = `plugins."io.containerd.cri.v1.runtime"`, `plugins."io.containerd.cri.v1.images"`
	}
	// Port 0: parallel envs must not fight over the default 10010.
	fmt.Fprintf(&b, "[%s]\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n", server)
	if major < 2 {
		fmt.Fprintf(&b, "  sandbox_image = %q\n", c.Sandbox)
	} else {
		fmt.Fprintf(&b, "\n[%s]\n  snapshotter = %q\n  [%s.pinned_images]\n    sandbox = %q\n\n[%s]\n", images, c.Snapshotter, images, c.Sandbox, runtime)
	}
	// Root here lacks CAP_SYS_RESOURCE: never lower a process's oom_score_adj.
	b.WriteString("  restrict_oom_score_adj = true\n")
	fmt.Fprintf(&b, "  netns_mounts_under_state_dir = %t\n", c.NetnsUnderState)
	b.WriteString("  disable_apparmor = true\n")
	fmt.Fprintf(&b, "  [%s.containerd]\n", runtime)
	if major < 2 {
		fmt.Fprintf(&b, "    snapshotter = %q\n", c.Snapshotter)
	}
	b.WriteString("    default_runtime_name = \"runc\"\n")
	fmt.Fprintf(&b, "    [%s.containerd.runtimes.runc]\n      runtime_type = \"io.containerd.runc.v2\"\n", runtime)
	if c.RuncRoot != "" {
		fmt.Fprintf(&b, "      [%s.containerd.runtimes.runc.options]\n        Root = %q\n", runtime, c.RuncRoot)
	}
	fmt.Fprintf(&b, "  [%s.cni]\n", runtime)
	if major < 2 {
		fmt.Fprintf(&b, "    bin_dir = %q\n", c.CNIBinDir)
	} else {
		fmt.Fprintf(&b, "    bin_dirs = [%q]\n", c.CNIBinDir)
	}
	fmt.Fprintf(&b, "    conf_dir = %q\n    max_conf_num = 1\n", c.CNIConfDir)
	return b.String()
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}
