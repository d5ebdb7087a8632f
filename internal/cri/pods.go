package cri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PodSpec describes a pod sandbox to run, as kubelet would.
type PodSpec struct {
	Namespace string
	Name      string
	UID       string
	Attempt   uint32
	// Labels and Annotations are passed through to the runtime (optional).
	Labels      map[string]string
	Annotations map[string]string
	// LogDir is the pod's log directory; empty means a directory under
	// os.TempDir() named for the UID (created if missing).
	LogDir string
}

// RunPodSandbox creates and starts a Linux pod sandbox in its own network
// namespace (not host network, so the runtime invokes CNI) and returns its ID.
func (c *Client) RunPodSandbox(ctx context.Context, p PodSpec) (string, error) {
	logDir := p.LogDir
	if logDir == "" {
		logDir = filepath.Join(os.TempDir(), "ipledger-pod-logs", p.UID)
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return "", fmt.Errorf("cri: run pod sandbox %s/%s: log dir: %w", p.Namespace, p.Name, err)
	}
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{
			Name: p.Name, Namespace: p.Namespace, Uid: p.UID, Attempt: p.Attempt,
		},
		Hostname:     p.Name,
		LogDirectory: logDir,
		Labels:       p.Labels,
		Annotations:  p.Annotations,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{
					Network: runtimeapi.NamespaceMode_POD,
					Pid:     runtimeapi.NamespaceMode_POD,
					Ipc:     runtimeapi.NamespaceMode_POD,
				},
			},
		},
	}
	ctx, cancel := c.call(ctx)
	defer cancel()
	r, err := c.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return "", c.wrap("run pod sandbox", p.Namespace+"/"+p.Name, err)
	}
	return r.GetPodSandboxId(), nil
}

// StopPodSandbox stops the sandbox (the runtime tears its network down).
// An unknown id yields an error wrapping ErrNotFound.
func (c *Client) StopPodSandbox(ctx context.Context, id string) error {
	ctx, cancel := c.call(ctx)
	defer cancel()
	if _, err := c.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return c.wrap("stop pod sandbox", id, err)
	}
	return nil
}

// RemovePodSandbox removes a sandbox (containerd stops it first if needed).
func (c *Client) RemovePodSandbox(ctx context.Context, id string) error {
	ctx, cancel := c.call(ctx)
	defer cancel()
	if _, err := c.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return c.wrap("remove pod sandbox", id, err)
	}
	return nil
}
