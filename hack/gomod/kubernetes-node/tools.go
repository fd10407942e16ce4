//go:build tools

// Package tools pins the node commands of the real node (hack/real-node.sh):
// kubelet and kube-proxy, from the same k8s.io/kubernetes version as the
// control plane. A wrapper module of its own (not hack/gomod/kubernetes) so
// the control plane's cache is not rebuilt for them and CI, which runs no
// real node, never builds them.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
