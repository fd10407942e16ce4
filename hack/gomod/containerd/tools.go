//go:build tools

// Package tools pins the real node's container runtime (hack/real-node.sh):
// the containerd daemon, its runc shim and the ctr client, from one
// github.com/containerd/containerd/v2 version. runc and the CNI plugins stay
// Debian's.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
