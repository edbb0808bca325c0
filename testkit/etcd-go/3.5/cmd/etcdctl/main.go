// Command etcdctl is etcd's own v3 command-line client (go.etcd.io/etcd/etcdctl/v3, pinned
// in go.mod at the server's version), built unchanged for etcd-cache's tests.
package main

import "go.etcd.io/etcd/etcdctl/v3/ctlv3"

func main() {
	ctlv3.MustStart()
}
