// kube-apiserver of the pinned k8s.io/kubernetes release, its own main (cmd/kube-apiserver)
// with one addition for the harness: KUBE_APISERVER_CONSISTENCY_CHECK_PERIOD (a Go duration)
// sets the period of the watch cache's consistency check against etcd
// (k8s.io/apiserver/pkg/storage/cacher/consistency.CheckPeriod, 5 minutes in a release
// build, jittered up to 1.5x), so that a run of a few minutes sees it run more than once.
// Unset, the binary is the release's kube-apiserver.
package main

import (
	"fmt"
	"os"
	"time"
	_ "time/tzdata" // as cmd/kube-apiserver: for timeZone support in CronJob

	"k8s.io/apiserver/pkg/storage/cacher/consistency"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	if v := os.Getenv("KUBE_APISERVER_CONSISTENCY_CHECK_PERIOD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "KUBE_APISERVER_CONSISTENCY_CHECK_PERIOD=%q: want a positive Go duration such as 20s\n", v)
			os.Exit(2)
		}
		consistency.CheckPeriod = d
	}
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
