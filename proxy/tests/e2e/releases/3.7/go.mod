module etcd-cache-proxy/e2e-3.7

go 1.26.0

// One etcd release for everything the e2e framework runs; run.sh builds with -mod=mod,
// which keeps go.sum complete.
require (
	go.etcd.io/etcd/etcdctl/v3 v3.7.3
	go.etcd.io/etcd/etcdutl/v3 v3.7.3
	go.etcd.io/etcd/server/v3 v3.7.3
	go.etcd.io/etcd/tests/v3 v3.7.3
)
