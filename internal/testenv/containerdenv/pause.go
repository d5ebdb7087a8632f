package containerdenv

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

// pauseSrc is the sandbox's only process: it waits for SIGTERM or SIGINT and
// exits 0 (as PID 1 it needs the handlers to be signalled at all).
const pauseSrc = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
	os.Exit(0)
}
`

var pauseMu sync.Mutex

// pauseKey identifies the pause image content: source, Go version, arch.
func pauseKey() string {
	h := sha256.Sum256([]byte(pauseSrc + "\x00" + runtime.Version() + "\x00" + runtime.GOARCH + "\x00v1"))
	return hex.EncodeToString(h[:])[:16]
}

// pauseImage returns the image reference and the path of a docker-archive tar
// holding the locally built pause image, building it once per content key
// (cached under os.TempDir()).
func pauseImage() (ref, tarPath string, err error) {
	pauseMu.Lock()
	defer pauseMu.Unlock()
	key := pauseKey()
	ref = "ipledger.local/pause:" + key
	tarPath = filepath.Join(os.TempDir(), "ipledger-pause-"+key+".tar")
	if fi, err := os.Stat(tarPath); err == nil && fi.Size() > 0 {
		return ref, tarPath, nil
	}
	bin, err := buildPause()
	if err != nil {
		return "", "", err
	}
	archive, err := dockerArchive(ref, bin)
	if err != nil {
		return "", "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(tarPath), ".ipledger-pause-*")
	if err != nil {
		return "", "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(archive); err != nil {
		tmp.Close()
		return "", "", err
	}
	if err := tmp.Close(); err != nil {
		return "", "", err
	}
	if err := os.Rename(tmp.Name(), tarPath); err != nil {
		return "", "", err
	}
	return ref, tarPath, nil
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// buildPause compiles pauseSrc as a static binary and returns its bytes.
func buildPause() ([]byte, error) {
	dir, err := os.MkdirTemp("", "ipledger-pause-build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(pauseSrc), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module pause\n\ngo 1.21\n"), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(goTool(), "build", "-trimpath", "-ldflags=-s -w", "-o", "pause", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOWORK=off", "GOFLAGS=-buildvcs=false", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("containerdenv: build pause: %v\n%s", err, out)
	}
	return os.ReadFile(filepath.Join(dir, "pause"))
}

var epoch = time.Unix(0, 0).UTC()

type tarEntry struct {
	name string
	mode int64
	dir  bool
	data []byte
}

func writeTar(entries []tarEntry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if !e.dir {
			if _, err := tw.Write(e.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// dockerArchive packs bin as /pause into a one-layer docker-archive
// (manifest.json, config with the layer's diff_id, <hex>/layer.tar).
func dockerArchive(ref string, bin []byte) ([]byte, error) {
	layer, err := writeTar([]tarEntry{
		{name: "dev/", mode: 0o755, dir: true},
		{name: "etc/", mode: 0o755, dir: true},
		{name: "proc/", mode: 0o555, dir: true},
		{name: "sys/", mode: 0o555, dir: true},
		{name: "pause", mode: 0o755, data: bin},
	})
	if err != nil {
		return nil, err
	}
	layerSum := sha256.Sum256(layer)
	layerHex := hex.EncodeToString(layerSum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": []string{"/pause"},
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{"sha256:" + layerHex},
		},
		"history": []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "ipledger containerdenv"}},
	})
	if err != nil {
		return nil, err
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{ref},
		"Layers":   []string{layerHex + "/layer.tar"},
	}})
	if err != nil {
		return nil, err
	}
	return writeTar([]tarEntry{
		{name: layerHex + "/", mode: 0o755, dir: true},
		{name: layerHex + "/layer.tar", mode: 0o644, data: layer},
		{name: configName, mode: 0o644, data: config},
		{name: "manifest.json", mode: 0o644, data: manifest},
	})
}

// PauseImage returns the reference of the locally built pause image and the
// path of a docker-archive holding it, for a containerd this package does not
// start (its sandbox_image, imported with ctr).
func PauseImage() (ref, tarPath string, err error) { return pauseImage() }
