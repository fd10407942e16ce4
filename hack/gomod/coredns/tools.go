//go:build tools

// Package tools pins CoreDNS (package main at the root of module
// github.com/coredns/coredns) for the real node's cluster DNS.
package tools

import (
	_ "github.com/coredns/coredns"
)
