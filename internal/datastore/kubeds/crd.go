package kubeds

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Documents splits a multi-document YAML manifest (documents separated by "---"
// lines) into objects; empty documents are skipped.
func Documents(manifest []byte) ([]*unstructured.Unstructured, error) {
	var docs [][]byte
	var cur bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(manifest))
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimRight(line, " \t") == "---" {
			docs = append(docs, append([]byte(nil), cur.Bytes()...))
			cur.Reset()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	docs = append(docs, cur.Bytes())
	var out []*unstructured.Unstructured
	for i, d := range docs {
		j, err := yaml.YAMLToJSON(d)
		if err != nil {
			return nil, fmt.Errorf("kubeds: manifest document %d: %w", i+1, err)
		}
		if s := strings.TrimSpace(string(j)); s == "null" || s == "" || s == "{}" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(j, &m); err != nil {
			return nil, fmt.Errorf("kubeds: manifest document %d: %w", i+1, err)
		}
		obj := &unstructured.Unstructured{Object: m}
		if obj.GetKind() == "" || obj.GetAPIVersion() == "" {
			return nil, fmt.Errorf("kubeds: manifest document %d has no kind or apiVersion", i+1)
		}
		out = append(out, obj)
	}
	return out, nil
}

// InstallCRDs applies the CustomResourceDefinitions of manifest (deploy/ipledger.yaml)
// with server-side apply and waits until the apiserver reports each Established.
// It returns the names of the CRDs installed.
func InstallCRDs(ctx context.Context, cfg *rest.Config, manifest []byte) ([]string, error) {
	docs, err := Documents(manifest)
	if err != nil {
		return nil, err
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeds: client: %w", err)
	}
	res := client.Resource(crdGVR)
	var names []string
	for _, d := range docs {
		if d.GetKind() != "CustomResourceDefinition" {
			continue
		}
		body, err := json.Marshal(d.Object)
		if err != nil {
			return nil, err
		}
		force := true
		if _, err := res.Patch(ctx, d.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "ipledger", Force: &force}); err != nil {
			return nil, fmt.Errorf("kubeds: apply CRD %s: %w", d.GetName(), err)
		}
		names = append(names, d.GetName())
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("kubeds: the manifest holds no CustomResourceDefinition")
	}
	for _, n := range names {
		for {
			crd, err := res.Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("kubeds: CRD %s: %w", n, err)
			}
			if established(crd) {
				break
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("kubeds: CRD %s not Established: %w", n, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return names, nil
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
