//go:build tools

// Package robustness pins etcd's test module (go.etcd.io/etcd/tests/v3) at the release whose
// robustness suite (tests/v3/robustness) run.sh builds with `go test -c`. Nothing here is
// built: the imports below are what the test binary imports, listed so that `go mod tidy`
// keeps their go.sum lines. Regenerate with
//
//	go list -e -f '{{join .TestImports "\n"}}' go.etcd.io/etcd/tests/v3/robustness
package robustness

import (
	_ "github.com/stretchr/testify/require"
	_ "go.etcd.io/etcd/client/pkg/v3/transport"
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "go.etcd.io/etcd/tests/v3/framework"
	_ "go.etcd.io/etcd/tests/v3/framework/e2e"
	_ "go.etcd.io/etcd/tests/v3/robustness/client"
	_ "go.etcd.io/etcd/tests/v3/robustness/failpoint"
	_ "go.etcd.io/etcd/tests/v3/robustness/identity"
	_ "go.etcd.io/etcd/tests/v3/robustness/model"
	_ "go.etcd.io/etcd/tests/v3/robustness/report"
	_ "go.etcd.io/etcd/tests/v3/robustness/scenarios"
	_ "go.etcd.io/etcd/tests/v3/robustness/traffic"
	_ "go.etcd.io/etcd/tests/v3/robustness/validate"
	_ "go.etcd.io/gofail/runtime"
	_ "go.uber.org/zap"
	_ "go.uber.org/zap/zaptest"
	_ "golang.org/x/sync/errgroup"
)
