//go:build tools

// Package tools pins etcd's server command (package main of module
// go.etcd.io/etcd/server/v3) for hack/build-tools.sh.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
