package kubeenv

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// VersionEnv names the environment variable choosing the Kubernetes release
// the environments build and run: one of Releases' versions (DefaultVersion
// when unset).
const VersionEnv = "IPLEDGER_KUBE_VERSION"

// DefaultVersion is the release an environment runs when VersionEnv is unset.
const DefaultVersion = "v1.36.3"

// ErrUnknownVersion: VersionEnv names a release that is not in Releases.
var ErrUnknownVersion = errors.New("no such Kubernetes release in kubeenv.Releases")

// Release is one Kubernetes release and what its build and its e2e suite pin,
// each read from that release's own tree.
type Release struct {
	// Version is the k8s.io/kubernetes tag; Staging the version its staging
	// modules (k8s.io/api, client-go, ...) are published under.
	Version, Staging string
	// Etcd is the go.etcd.io/etcd/server/v3 its go.mod requires.
	Etcd string
	// CoreDNS is the CoreDNS kubeadm deploys (cmd/kubeadm/app/constants).
	CoreDNS string
	// Images are the tags of the e2e images the suite asks for
	// (test/utils/image/manifest.go).
	Images E2EImages
	// CloudControllers are the cloud-provider controllers this release's
	// kube-controller-manager still has, which a cluster without a cloud
	// provider turns off (v1.37 has none left, and refuses to start when told
	// to turn off a controller it does not know).
	CloudControllers []string
}

// E2EImages are the tags of the e2e suite's images that e2eenv builds.
type E2EImages struct {
	Agnhost, Busybox, Pause, GlibcDNS, Regression74839 string
	// DistrolessIptables is the build-image registry's distroless-iptables (the
	// KubeProxy CLOSE_WAIT test's privileged host-network pod).
	DistrolessIptables string
}

// Releases are the Kubernetes releases the environments can run.
var Releases = []Release{
	{Version: "v1.36.3", Staging: "v0.36.3", Etcd: "v3.6.8", CoreDNS: "v1.14.2",
		Images:           E2EImages{Agnhost: "2.63.0", Busybox: "1.37.0-1", Pause: "3.10.2", GlibcDNS: "2.0.0", Regression74839: "1.4", DistrolessIptables: "v0.9.6"},
		CloudControllers: []string{"service-lb-controller", "cloud-node-lifecycle-controller"}},
	{Version: "v1.37.2", Staging: "v0.37.2", Etcd: "v3.7.0", CoreDNS: "v1.14.6",
		Images: E2EImages{Agnhost: "2.66.1", Busybox: "1.37.0-2", Pause: "3.10.2", GlibcDNS: "2.1.1", Regression74839: "1.5", DistrolessIptables: "v0.9.9"}},
}

// selectRelease returns the release named by value (DefaultVersion when
// empty; the leading "v" may be left out), or an error naming VersionEnv and
// the choices.
func selectRelease(value string) (Release, error) {
	v := strings.TrimSpace(value)
	if v == "" {
		v = DefaultVersion
	}
	if !strings.HasPrefix(v, "v") {
		v = "v" + v
	}
	i := slices.IndexFunc(Releases, func(r Release) bool { return r.Version == v })
	if i < 0 {
		var names []string
		for _, r := range Releases {
			names = append(names, r.Version)
		}
		return Release{}, fmt.Errorf("kubeenv: %s=%q: %w; choose one of %s, or unset it for %s",
			VersionEnv, value, ErrUnknownVersion, strings.Join(names, ", "), DefaultVersion)
	}
	return Releases[i], nil
}

// Current is the release VersionEnv chooses; currentErr is why it could not
// (Binaries fails the test with it, so a typo never runs the default quietly).
var Current, currentErr = func() (Release, error) {
	r, err := selectRelease(os.Getenv(VersionEnv))
	if err != nil {
		d, _ := selectRelease("")
		return d, err
	}
	return r, nil
}()

// Version is the Kubernetes release the cluster runs; StagingVersion the
// matching version of its staging modules; EtcdModuleVersion the etcd server
// its go.mod requires, whose main package builds the etcd binary.
var (
	Version           = Current.Version
	StagingVersion    = Current.Staging
	EtcdModuleVersion = Current.Etcd
)

// controllersFlag is kube-controller-manager's --controllers for r: every
// on-by-default controller but the cloud provider's.
func (r Release) controllersFlag() string {
	f := "*"
	for _, c := range r.CloudControllers {
		f += ",-" + c
	}
	return f
}
