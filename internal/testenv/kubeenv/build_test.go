package kubeenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// stampBefore is how the caches were stamped before the recipes moved to
// buildcache: the first 16 hex digits of the SHA-256 of what the build
// depended on.
func stampBefore(material string) string {
	h := sha256.Sum256([]byte(material))
	return hex.EncodeToString(h[:])[:16]
}

// TestRecipesKeepTheirStamps: the Kubernetes, extra-command and flanneld
// caches built before buildcache (a cold Kubernetes build is 12 minutes on
// this machine) stay valid: each recipe's stamp is the one written then.
func TestRecipesKeepTheirStamps(t *testing.T) {
	var mod strings.Builder
	fmt.Fprintf(&mod, "module ipledger.test/kubebuild\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n", Version)
	for _, m := range stagingModules {
		fmt.Fprintf(&mod, "\tk8s.io/%s => k8s.io/%s %s\n", m, m, StagingVersion)
	}
	mod.WriteString(")\n")
	if goMod() != mod.String() {
		t.Fatalf("the build module changed:\n%s\nwas\n%s", goMod(), mod.String())
	}
	kube := stampBefore(mod.String() + "\x00" + ldflags() + "\x00" + EtcdModuleVersion + "\x00" + runtime.Version() + "\x00" + strings.Join(Commands, ","))
	if got := kubeRecipe().Stamp(); got != kube {
		t.Errorf("Kubernetes stamp %s, the cache holds %s", got, kube)
	}
	if got, want := extraRecipe("kube-proxy", "", 0, nil).Stamp(), stampBefore(kube+"\x00kube-proxy"); got != want {
		t.Errorf("kube-proxy stamp %s, the cache holds %s", got, want)
	}
	flannel := stampBefore(FlannelModule + "@" + FlannelVersion + "\x00" + flannelLdflags() + "\x00" + strings.Join(flannelDropped, ",") + "\x00" + runtime.Version())
	if got := flannelRecipe().Stamp(); got != flannel {
		t.Errorf("flanneld stamp %s, the cache holds %s", got, flannel)
	}
	if kubeRecipe().Dir != CacheDir() || extraRecipe("x", "", 0, nil).LockFile != CacheDir()+"/.lock" {
		t.Errorf("the Kubernetes cache moved: dir %s, extra lock %s", kubeRecipe().Dir, extraRecipe("x", "", 0, nil).LockFile)
	}
}
