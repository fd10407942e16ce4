//go:build tools

// Package tools pins the Kubeflow training operator (release-1.9 line) command
// for hack/build-tools.sh.
package tools

import (
	_ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
)
