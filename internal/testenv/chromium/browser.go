package chromium

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv"
)

// Browser is one headless chromium process that loads page after page in one tab,
// driven over the DevTools protocol on a pair of pipes (--remote-debugging-pipe:
// chromium reads commands on its fd 3 and answers on its fd 4, each message JSON
// ended by a NUL byte). Starting chromium costs seconds, loading a page in a
// running one milliseconds: a test that checks several pages starts one Browser.
// Its methods are for one goroutine.
type Browser struct {
	tb      testing.TB
	cmd     *exec.Cmd
	stderr  testenv.Buffer // chromium's, for the failure messages
	in      *os.File       // commands to chromium
	session string         // the tab's DevTools session

	mu      sync.Mutex
	nextID  int
	waiting map[int]chan message
	loaded  map[string]bool // loader IDs whose document fired its load event
	loadSig chan struct{}   // a value when loaded grew
	readErr error           // why the reader stopped (set before done is closed)
	done    chan struct{}
	closing sync.Once
}

// message is a DevTools message: a response (ID set) or an event (Method set).
type message struct {
	ID        int             `json:"id,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// callTimeout bounds one DevTools command, a page load included.
const callTimeout = 90 * time.Second

// Start starts headless chromium (installing Debian's package if it is missing; see
// Path) with a blank tab of 1400×1000 pixels; it is stopped by its PID when tb ends.
func Start(tb testing.TB) *Browser {
	tb.Helper()
	bin := Path(tb)
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	b := &Browser{tb: tb, in: cmdW, waiting: map[int]chan message{},
		loaded: map[string]bool{}, loadSig: make(chan struct{}, 1), done: make(chan struct{})}
	b.cmd = exec.Command(bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir="+tb.TempDir(), "--hide-scrollbars", "--remote-debugging-pipe", "about:blank")
	b.cmd.ExtraFiles = []*os.File{cmdR, outW} // fd 3, fd 4
	b.cmd.Stderr = &b.stderr
	if err := b.cmd.Start(); err != nil {
		tb.Fatalf("chromium: %v", err)
	}
	cmdR.Close()
	outW.Close()
	tb.Cleanup(b.Close)
	go b.read(outR)

	var target struct{ TargetID string }
	b.call("", "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var attached struct{ SessionID string }
	b.call("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached)
	b.session = attached.SessionID
	b.call(b.session, "Page.enable", nil, nil)
	b.call(b.session, "Page.setLifecycleEventsEnabled", map[string]any{"enabled": true}, nil)
	b.call(b.session, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": false}, nil)
	return b
}

// read hands each message chromium writes to whoever waits for it: a response to
// its caller; of the events, a document's load (by its loader ID) to load.
func (b *Browser) read(r *os.File) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 256<<20) // a screenshot comes as one message
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, 0); i >= 0 {
			return i + 1, data[:i], nil
		}
		if atEOF && len(data) > 0 {
			return 0, nil, fmt.Errorf("chromium's pipe ended inside a message")
		}
		return 0, nil, nil
	})
	var err error
	for sc.Scan() {
		var m message
		if err = json.Unmarshal(sc.Bytes(), &m); err != nil {
			break
		}
		if m.ID == 0 {
			var ev struct{ LoaderID, Name string }
			if m.Method == "Page.lifecycleEvent" && json.Unmarshal(m.Params, &ev) == nil && ev.Name == "load" {
				b.mu.Lock()
				b.loaded[ev.LoaderID] = true
				b.mu.Unlock()
				select {
				case b.loadSig <- struct{}{}:
				default:
				}
			}
			continue
		}
		b.mu.Lock()
		ch := b.waiting[m.ID]
		delete(b.waiting, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
	if err == nil {
		err = sc.Err()
	}
	if err == nil {
		err = fmt.Errorf("chromium closed its DevTools pipe")
	}
	b.readErr = err
	close(b.done)
}

// call sends one command (on session, or to the browser when session is empty) and
// decodes its result into out (when not nil), failing tb on an error or timeout.
func (b *Browser) call(session, method string, params any, out any) {
	b.tb.Helper()
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan message, 1)
	b.waiting[id] = ch
	b.mu.Unlock()
	req := map[string]any{"id": id, "method": method}
	if params != nil {
		req["params"] = params
	}
	if session != "" {
		req["sessionId"] = session
	}
	msg, _ := json.Marshal(req)
	if _, err := b.in.Write(append(msg, 0)); err != nil {
		b.tb.Fatalf("chromium %s: %v\n%s", method, err, b.stderrText())
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			b.tb.Fatalf("chromium %s: %s (code %d)", method, m.Error.Message, m.Error.Code)
		}
		if out != nil {
			if err := json.Unmarshal(m.Result, out); err != nil {
				b.tb.Fatalf("chromium %s: %v", method, err)
			}
		}
	case <-b.done:
		b.tb.Fatalf("chromium %s: %v\n%s", method, b.readErr, b.stderrText())
	case <-time.After(callTimeout):
		b.tb.Fatalf("chromium %s: no answer within %v\n%s", method, callTimeout, b.stderrText())
	}
}

func (b *Browser) stderrText() string {
	return b.stderr.String()
}

// load navigates the tab to url and returns once that document fired its load
// event (the page's own refresh loads another document, under another loader ID).
func (b *Browser) load(url string) {
	b.tb.Helper()
	var nav struct{ FrameID, LoaderID, ErrorText string }
	b.call(b.session, "Page.navigate", map[string]any{"url": url}, &nav)
	if nav.ErrorText != "" {
		b.tb.Fatalf("chromium: loading %s: %s", url, nav.ErrorText)
	}
	deadline := time.After(callTimeout)
	for {
		b.mu.Lock()
		done := b.loaded[nav.LoaderID]
		b.mu.Unlock()
		if done {
			return
		}
		select {
		case <-b.loadSig:
		case <-b.done:
			b.tb.Fatalf("chromium: loading %s: %v\n%s", url, b.readErr, b.stderrText())
		case <-deadline:
			b.tb.Fatalf("chromium: %s not loaded within %v", url, callTimeout)
		}
	}
}

// DOM loads url and returns its DOM as rendered (what chromium --dump-dom prints).
func (b *Browser) DOM(url string) string {
	b.tb.Helper()
	b.load(url)
	var r struct {
		Result struct {
			Value string `json:"value"`
		} `json:"result"`
		ExceptionDetails json.RawMessage `json:"exceptionDetails"`
	}
	b.call(b.session, "Runtime.evaluate", map[string]any{"expression": "document.documentElement.outerHTML", "returnByValue": true}, &r)
	if r.ExceptionDetails != nil {
		b.tb.Fatalf("chromium: reading the DOM of %s: %s", url, r.ExceptionDetails)
	}
	return r.Result.Value
}

// Screenshot loads url and saves a PNG of it (1400×1000) at path.
func (b *Browser) Screenshot(url, path string) {
	b.tb.Helper()
	b.load(url)
	var r struct{ Data string }
	b.call(b.session, "Page.captureScreenshot", map[string]any{"format": "png"}, &r)
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil || len(png) < 1000 {
		b.tb.Fatalf("screenshot of %s: %d bytes, %v", url, len(png), err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.tb.Fatal(err)
	}
}

// Close asks chromium to close and waits for it, killing its PID if it does not
// exit within ten seconds. It runs when the test ends, if not before.
func (b *Browser) Close() {
	b.closing.Do(b.stop)
}

func (b *Browser) stop() {
	msg, _ := json.Marshal(map[string]any{"id": 1 << 30, "method": "Browser.close"})
	b.in.Write(append(msg, 0))
	exited := make(chan struct{})
	go func() {
		b.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill()
		<-exited
	}
	b.in.Close()
}
