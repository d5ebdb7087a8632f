package main

import (
	"io"
	"strings"
	"testing"
)

// TestBadFlags: each bad flag is refused with a message naming it and the fix.
func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--reconcile-interval", "0s"}, "--reconcile-interval: must be positive"},
		{[]string{"--release-grace", "-1s"}, "--release-grace: must be positive"},
		{[]string{"--reuse-delay", "-1s"}, "--reuse-delay: must not be negative"},
		{[]string{"--release-grace", "2m", "--stranded-grace", "1m"}, "raise --stranded-grace"},
		{[]string{"--etcd-endpoints", "http://127.0.0.1:2379"}, "--etcd-endpoints"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		var stderr strings.Builder
		if _, err := parse(c.args, &stderr); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse %q: %v, want an error with %q", c.args, err, c.want)
		}
	}
	if _, err := parse(nil, io.Discard); err != nil {
		t.Errorf("defaults refused: %v", err)
	}
}

// TestInstallCNIFlags: install-cni refuses stray arguments and reports a
// failed install with exit status 1 and the reason on stderr.
func TestInstallCNIFlags(t *testing.T) {
	var out, errb strings.Builder
	if code := installCNI([]string{"extra"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unexpected arguments") {
		t.Errorf("stray argument: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	dir := t.TempDir()
	if code := installCNI([]string{"--conflist", dir + "/absent", "--cni-bin-dir", dir, "--cni-conf-dir", dir}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "conflist") {
		t.Errorf("missing conflist: exit %d, stderr %q", code, errb.String())
	}
}
