//go:build tools

// Package tools pins the kwok command for hack/build-tools.sh.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
