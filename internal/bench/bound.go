package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The lower bound is the issue's limit measured rather than estimated: "the floor plus
// one socket round trip plus one sync". boundplugin is the least a durable IPAM
// plugin of this architecture can do in Go: read stdin, connect to the agent's unix
// socket, send it, read the answer, print a result, exit; no CNI dispatch, no config
// checks. boundserver is the least its agent can do: read the request, pwrite 512 bytes
// into a preallocated file and fdatasync it (what ipledgerd's write-ahead log does
// once per commit), answer. The harness execs boundplugin like the plugins,
// interleaved with them, so ipledger's ADD and DEL can be read against the bound as
// well as against the floor.

const boundPluginSrc = `// Command boundplugin is the benchmark's lower bound of a durable IPAM plugin.
package main

import (
	"io"
	"net"
	"os"
)

var socket string // set by -ldflags -X

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		os.Exit(2)
	}
	c, err := net.Dial("unix", socket)
	if err != nil {
		os.Exit(3)
	}
	for i, b := range in {
		if b == '\n' {
			in[i] = ' '
		}
	}
	if _, err := c.Write(append(in, '\n')); err != nil {
		os.Exit(4)
	}
	var buf [512]byte
	n := 0
	for n == 0 || buf[n-1] != '\n' {
		m, err := c.Read(buf[n:])
		if err != nil {
			os.Exit(5)
		}
		n += m
	}
	os.Stdout.Write([]byte("{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"" + string(buf[:n-1]) + "\"}]}"))
}
`

const boundServerSrc = `// Command boundserver is the benchmark's lower bound of a durable IPAM agent: one
// pwrite and one fdatasync per request, then the answer.
package main

import (
	"bufio"
	"net"
	"os"
	"sync"
	"syscall"
)

func main() {
	socket, file := os.Args[1], os.Args[2]
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		panic(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil { // preallocated: fdatasync flushes data only
		panic(err)
	}
	if err := f.Sync(); err != nil {
		panic(err)
	}
	os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		panic(err)
	}
	os.Stdout.WriteString("ready\n")
	var mu sync.Mutex
	var off int64
	rec := make([]byte, 512)
	for {
		c, err := l.Accept()
		if err != nil {
			panic(err)
		}
		go func() {
			defer c.Close()
			if _, err := bufio.NewReader(c).ReadBytes('\n'); err != nil {
				return
			}
			mu.Lock()
			_, werr := f.WriteAt(rec, off)
			if werr == nil {
				werr = syscall.Fdatasync(int(f.Fd()))
			}
			off = (off + 512) % (1 << 20)
			mu.Unlock()
			if werr != nil {
				panic(werr)
			}
			c.Write([]byte("10.0.0.2/24\n"))
		}()
	}
}
`

// buildProgram builds a one-file static Go program the way the floor is built.
func buildProgram(out, src string, ldflags ...string) error {
	dir, err := os.MkdirTemp("", "ipledger-prog-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	files := map[string]string{"go.mod": "module prog\n\ngo 1.22\n", "main.go": src}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w "+strings.Join(ldflags, " "), "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", filepath.Base(out), err, b)
	}
	return nil
}

// startBound builds the bound's plugin (into CNI_PATH as "boundplugin") and server,
// and starts the server; it is stopped by PID at cleanup.
func (h *harness) startBound() error {
	socket := filepath.Join(h.work, "bound.sock")
	server := filepath.Join(h.work, "boundserver")
	if err := buildProgram(h.bin("boundplugin"), boundPluginSrc, "-X main.socket="+socket); err != nil {
		return err
	}
	if err := buildProgram(server, boundServerSrc); err != nil {
		return err
	}
	cmd := exec.Command(server, socket, filepath.Join(h.work, "bound.log"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	h.tb.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	ready := make(chan error, 1)
	go func() {
		buf := make([]byte, 6)
		_, err := out.Read(buf)
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			return fmt.Errorf("boundserver did not start: %w", err)
		}
	case <-time.After(30 * time.Second):
		return fmt.Errorf("boundserver did not start in 30 s")
	}
	return nil
}

// bound execs the bound's plugin once with conf on stdin.
func (h *harness) bound(conf []byte) (time.Duration, error) {
	d, out, err := h.exec(call{plugin: "boundplugin", command: "ADD", containerID: "bound", conf: conf})
	if err == nil && !strings.Contains(string(out), "10.0.0.2/24") {
		err = fmt.Errorf("boundplugin answered %q", out)
	}
	return d, err
}
