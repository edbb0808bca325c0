// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3, pinned in go.mod), built
// unchanged for etcd-cache's tests: `cargo xtask etcd-bins` builds it into target/etcd/3.7/.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
