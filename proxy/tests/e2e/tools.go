//go:build tools

// Package e2e pins etcd's test module (go.etcd.io/etcd/tests/v3) and the binaries its e2e
// framework runs (etcd, etcdctl, etcdutl) at one release. Nothing here is built into a test:
// the imports below are what `go test -c` of tests/v3/e2e and tests/v3/common needs, listed
// so that `go mod tidy` keeps their go.sum lines. Regenerate the list with
//
//	go list -e -tags "cluster_proxy e2e" -f '{{join .TestImports "\n"}}' \
//	  go.etcd.io/etcd/tests/v3/e2e go.etcd.io/etcd/tests/v3/common
package e2e

import (
	_ "github.com/coreos/go-semver/semver"
	_ "github.com/golang/protobuf/proto"
	_ "github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	_ "github.com/prometheus/client_model/go"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/stretchr/testify/assert"
	_ "github.com/stretchr/testify/require"
	_ "go.etcd.io/bbolt"
	_ "go.etcd.io/etcd/api/v3/authpb"
	_ "go.etcd.io/etcd/api/v3/etcdserverpb"
	_ "go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	_ "go.etcd.io/etcd/api/v3/version"
	_ "go.etcd.io/etcd/client/pkg/v3/fileutil"
	_ "go.etcd.io/etcd/client/pkg/v3/testutil"
	_ "go.etcd.io/etcd/client/pkg/v3/transport"
	_ "go.etcd.io/etcd/client/pkg/v3/types"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/etcdctl/v3/ctlv3"
	_ "go.etcd.io/etcd/etcdutl/v3/etcdutl"
	_ "go.etcd.io/etcd/etcdutl/v3/snapshot"
	_ "go.etcd.io/etcd/pkg/v3/expect"
	_ "go.etcd.io/etcd/pkg/v3/flags"
	_ "go.etcd.io/etcd/pkg/v3/stringutil"
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "go.etcd.io/etcd/server/v3/etcdserver"
	_ "go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	_ "go.etcd.io/etcd/server/v3/etcdserver/api/snap"
	_ "go.etcd.io/etcd/server/v3/etcdserver/api/v2store"
	_ "go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	_ "go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	_ "go.etcd.io/etcd/server/v3/storage/datadir"
	_ "go.etcd.io/etcd/server/v3/storage/mvcc/testutil"
	_ "go.etcd.io/etcd/server/v3/storage/schema"
	_ "go.etcd.io/etcd/tests/v3/framework"
	_ "go.etcd.io/etcd/tests/v3/framework/config"
	_ "go.etcd.io/etcd/tests/v3/framework/e2e"
	_ "go.etcd.io/etcd/tests/v3/framework/interfaces"
	_ "go.etcd.io/etcd/tests/v3/framework/testutils"
	_ "go.etcd.io/raft/v3"
	_ "go.uber.org/zap"
	_ "go.uber.org/zap/zaptest"
	_ "golang.org/x/sync/errgroup"
	_ "google.golang.org/protobuf/encoding/protojson"
)
