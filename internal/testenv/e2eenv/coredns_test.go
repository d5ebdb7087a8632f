package e2eenv

import (
	"crypto/sha256"
	"encoding/hex"
	"runtime"
	"testing"
)

// TestCoreDNSRecipeKeepsItsStamp: a CoreDNS cache built before buildcache
// stays valid (its stamp is the one written then).
func TestCoreDNSRecipeKeepsItsStamp(t *testing.T) {
	h := sha256.Sum256([]byte("github.com/coredns/coredns@" + CoreDNSVersion + "\x00" + runtime.Version()))
	if got, want := coreDNSRecipe().Stamp(), hex.EncodeToString(h[:])[:16]; got != want {
		t.Fatalf("coredns stamp %s, the cache holds %s", got, want)
	}
}
