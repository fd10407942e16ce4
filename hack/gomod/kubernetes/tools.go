//go:build tools

// Package tools pins the Kubernetes commands hack/build-tools.sh builds.
// k8s.io/kubernetes cannot be `go install`ed directly (its go.mod replaces the
// k8s.io/* staging modules with ./staging paths), so this wrapper module
// requires it and replaces the staging modules with their published v0.33.x
// versions instead.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
