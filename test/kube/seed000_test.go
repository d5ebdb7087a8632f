//go:build kubelet

package kube_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// seed000 (../shared/seeds/000): Jobs whose pods complete, then the Jobs'
// deletion. The kubelet tears a Completed pod's sandbox down (DEL), and at
// deletion removes it (containerd sends a second DEL with an empty
// CNI_NETNS). While a Job's pods run, each address is leased to its pod; once
// they completed, no lease is left even though the pods still exist; after
// deletion the audit balances.
func seed000(t *testing.T, n *node) {
	const ns, jobs, completions = "seed000", 3, 6
	n.namespace(t, ns)
	for j := 0; j < jobs; j++ {
		n.c.Apply(t, fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: job%[1]d, namespace: %[2]s}
spec:
  completions: %[3]d
  parallelism: 3
  backoffLimit: 0
  template:
    metadata: {labels: {job: job%[1]d}}
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      automountServiceAccountToken: false
      enableServiceLinks: false
      containers:
      - name: main
        image: %[4]s
        imagePullPolicy: Never
        command: ["/bin/busybox", "sleep", "4"]
`, j, ns, completions, podImage))
	}
	// While pods run: each Ready pod's address is leased to it (no release
	// while it runs). Sampled until the Jobs complete.
	t0 := time.Now()
	samples := 0
	if err := kubeenv.WaitFor(4*time.Minute, 500*time.Millisecond, func() (bool, error) {
		pods, err := n.c.Pods(ns, "")
		if err != nil {
			return false, err
		}
		ls, err := n.leases()
		if err != nil {
			return false, err
		}
		leased := map[string]string{}
		for _, l := range ls {
			for _, c := range l.IPs {
				leased[strings.Split(c, "/")[0]] = l.Name
			}
		}
		succeeded := 0
		for _, p := range pods {
			if p.Ready() && p.Status.PodIP != "" {
				// The pod may finish between the two reads: only a pod still
				// Running after the lease list was read counts.
				if name, ok := leased[p.Status.PodIP]; !ok || name != p.Metadata.Name {
					again, _ := n.c.Pods(ns, "job="+p.Metadata.Labels["job"])
					for _, q := range again {
						if q.Metadata.Name == p.Metadata.Name && q.Ready() && q.Status.PodIP == p.Status.PodIP {
							t.Errorf("running pod %s: address %s leased to %q", p.Metadata.Name, p.Status.PodIP, name)
						}
					}
				}
				samples++
			}
			if p.Status.Phase == "Succeeded" {
				succeeded++
			}
		}
		return succeeded == jobs*completions, fmt.Errorf("%d of %d pods succeeded", succeeded, jobs*completions)
	}); err != nil {
		t.Fatal(err)
	}
	done := time.Since(t0)
	// Completed pods still exist; their sandboxes were torn down.
	d := n.settle(t, time.Minute)
	t.Logf("%d Jobs x %d completions done in %v (%d running-pod samples, each leased to its pod); with the %d Completed pods still present the ledger was empty %v later", jobs, completions, done.Round(time.Millisecond), samples, jobs*completions, d.Round(time.Millisecond))
	n.c.MustKubectl(t, "delete", "jobs", "-n", ns, "--all", "--cascade=foreground", "--wait=true")
	n.waitGone(t, ns, "", 2*time.Minute)
	n.settle(t, time.Minute)
	t.Log("Jobs deleted: pods removed (second DEL, empty netns), zero leases, audit balanced")
}
