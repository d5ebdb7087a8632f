package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// CallOnce is Call for a process that makes one call and exits (the CNI plugin). It
// uses a blocking socket with kernel timeouts (SO_SNDTIMEO, SO_RCVTIMEO) set from
// ctx's deadline instead of Go's network poller: no epoll instance, no eventfd, no
// park and wake-up of the calling goroutine on another thread. Measured on the
// plugin's ADD and DEL (issue 13) that is a share of the time above the exec floor;
// written on syscall by hand for that reason. ctx's deadline bounds every step; a ctx
// cancelled without a deadline is not noticed during a step (a plugin has no one to
// cancel it: the runtime kills it). Errors are those of Call.
func CallOnce(ctx context.Context, socket string, req Request) (*Response, error) {
	req.Version = Version
	b, err := MarshalRequest(req)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: socket %s: %v", ErrUnreachable, socket, err)
	}
	dl, hasDL := ctx.Deadline()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: socket %s: %v", ErrUnreachable, socket, err)
	}
	defer syscall.Close(fd)
	c := &blockingConn{fd: fd, dl: dl, hasDL: hasDL}
	if err := c.connect(socket); err != nil {
		return nil, fmt.Errorf("%w: socket %s: dial unix %s: %v (is ipledgerd running?)", ErrUnreachable, socket, socket, err)
	}
	werr := c.writeAll(append(b, '\n'))
	line, err := c.readLine(MaxResponse)
	if err != nil {
		if werr != nil {
			return nil, fmt.Errorf("%w: socket %s: write: %v", ErrUnreachable, socket, werr)
		}
		return nil, fmt.Errorf("%w: socket %s: reading the answer: %v", ErrNoAnswer, socket, err)
	}
	return decodeAnswer(socket, line)
}

// errTimeout: the deadline passed during a blocking step.
var errTimeout = errors.New("i/o timeout")

// blockingConn is a blocking unix stream socket whose steps end at dl.
type blockingConn struct {
	fd    int
	dl    time.Time
	hasDL bool
}

// arm sets the socket's send and receive timeouts to what is left until the deadline.
func (c *blockingConn) arm() error {
	if !c.hasDL {
		return nil
	}
	left := time.Until(c.dl)
	if left <= 0 {
		return errTimeout
	}
	if left < time.Microsecond {
		left = time.Microsecond // a zero timeval means no timeout
	}
	tv := syscall.NsecToTimeval(left.Nanoseconds())
	if err := syscall.SetsockoptTimeval(c.fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &tv); err != nil {
		return err
	}
	return syscall.SetsockoptTimeval(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
}

// retry runs op, again after a signal (EINTR: with a timeout set, socket calls are not
// restarted) with the timeouts re-armed, and maps a timeout to errTimeout.
func (c *blockingConn) retry(op func() error) error {
	for {
		if err := c.arm(); err != nil {
			return err
		}
		err := op()
		switch err {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN, syscall.EINPROGRESS:
			return errTimeout
		}
		return err
	}
}

func (c *blockingConn) connect(path string) error {
	return c.retry(func() error {
		err := syscall.Connect(c.fd, &syscall.SockaddrUnix{Name: path})
		if err == syscall.EISCONN { // an interrupted connect that completed
			return nil
		}
		return err
	})
}

// writeAll writes b with as few write calls as the kernel allows (one, for a request).
func (c *blockingConn) writeAll(b []byte) error {
	for len(b) > 0 {
		var n int
		err := c.retry(func() error {
			var err error
			n, err = syscall.Write(c.fd, b)
			return err
		})
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// readLine reads up to the first newline (which it drops), at most limit bytes.
func (c *blockingConn) readLine(limit int) ([]byte, error) {
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		var n int
		err := c.retry(func() error {
			var err error
			n, err = syscall.Read(c.fd, buf[len(buf):cap(buf)])
			return err
		})
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, errEOF
		}
		start := len(buf)
		buf = buf[:len(buf)+n]
		if i := bytes.IndexByte(buf[start:], '\n'); i >= 0 {
			line := buf[:start+i]
			if len(line) > limit {
				return nil, fmt.Errorf("%w: longer than %d bytes", errTooLong, limit)
			}
			return bytes.TrimSuffix(line, []byte{'\r'}), nil
		}
		if len(buf) > limit {
			return nil, fmt.Errorf("%w: longer than %d bytes", errTooLong, limit)
		}
	}
}

// errEOF: the agent closed the connection before a whole line.
var errEOF = errors.New("EOF")
