// Command gotest drives Go's clientv3 through etcd-cache-proxy. It is built and run by
// proxy/tests/go_client.rs, which starts etcd and the proxy.
//
//	gotest -proxy URL -etcd URL watches     every watch option, through the proxy vs etcd
//	gotest -proxy URL -etcd URL progress    RequestProgress and WithRequireLeader
//	gotest -proxy URL -etcd URL autosync    endpoint auto-sync stays on the proxy
//	gotest -proxy URL -etcd URL restart     a watch that lives through a proxy restart
//	gotest -etcd URL -prefix P -want A,B resolver
//	                                        etcd's naming resolver over --resolver-prefix
//	                                        finds exactly the proxies A,B (host:port) and
//	                                        a gRPC connection through it reads via them
//	gotest -etcd URL -prefix P -key K -count N resolver-watch
//	                                        a clientv3 watcher on a connection resolved
//	                                        over P watches the keys under K; prints
//	                                        "READY" once created, then must see the puts
//	                                        of K0000..K<N-1> in order, each once, whatever
//	                                        proxy dies meanwhile
//
// Each mode prints "OK <mode>" and exits 0, or exits non-zero with the reason. The
// restart mode prints "RESTART NOW" and waits for a line on stdin before it goes on.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"reflect"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/naming/endpoints"
	etcdresolver "go.etcd.io/etcd/client/v3/naming/resolver"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var (
	proxyURL = flag.String("proxy", "", "etcd-cache-proxy endpoint")
	etcdURL  = flag.String("etcd", "", "etcd endpoint")
	prefix   = flag.String("prefix", "", "--resolver-prefix of the proxies (resolver mode)")
	wantEPs  = flag.String("want", "", "the registered proxies, host:port, comma-separated (resolver mode)")
	watchKey = flag.String("key", "", "the key prefix to watch (resolver-watch mode)")
	count    = flag.Int("count", 0, "the puts to expect (resolver-watch mode)")
)

func connect(endpoint string, autoSync time.Duration) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:        []string{endpoint},
		DialTimeout:      5 * time.Second,
		AutoSyncInterval: autoSync,
	})
	if err != nil {
		log.Fatalf("connect %s: %v", endpoint, err)
	}
	return c
}

func ctxT(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// event is what both sides must agree on.
type event struct {
	Type    string
	Key     string
	Value   string
	ModRev  int64
	PrevVal string
	HasPrev bool
}

// events are a response's events in the form both sides are compared in.
func events(wr clientv3.WatchResponse) []event {
	var out []event
	for _, e := range wr.Events {
		ev := event{Type: e.Type.String(), Key: string(e.Kv.Key), Value: string(e.Kv.Value), ModRev: e.Kv.ModRevision}
		if e.PrevKv != nil {
			ev.HasPrev, ev.PrevVal = true, string(e.PrevKv.Value)
		}
		out = append(out, ev)
	}
	return out
}

// collect reads events until `until` (a revision) has been seen or the channel is
// quiet for a second after it.
func collect(wch clientv3.WatchChan, until int64) []event {
	var out []event
	timeout := time.After(15 * time.Second)
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				log.Fatalf("watch channel closed early")
			}
			if err := wr.Err(); err != nil {
				log.Fatalf("watch error: %v", err)
			}
			out = append(out, events(wr)...)
			if wr.Header.Revision >= until && !wr.Created && !wr.IsProgressNotify() {
				return out
			}
		case <-timeout:
			log.Fatalf("no watch response up to revision %d (got %v)", until, out)
		}
	}
}

func put(c *clientv3.Client, k, v string) int64 {
	ctx, cancel := ctxT(5 * time.Second)
	defer cancel()
	r, err := c.Put(ctx, k, v)
	if err != nil {
		log.Fatalf("put %s: %v", k, err)
	}
	return r.Header.Revision
}

func watches() {
	proxy, direct := connect(*proxyURL, 0), connect(*etcdURL, 0)
	first := put(direct, "/g/start", "0")
	for i := 0; i < 4; i++ {
		put(direct, fmt.Sprintf("/g/%d", i), fmt.Sprintf("v%d", i))
	}
	put(direct, "/g/1", "again")
	ctx, cancel := ctxT(5 * time.Second)
	if _, err := direct.Delete(ctx, "/g/2"); err != nil {
		log.Fatal(err)
	}
	cancel()
	ctx, cancel = ctxT(5 * time.Second)
	if _, err := direct.Txn(ctx).Then(clientv3.OpPut("/g/4", "t"), clientv3.OpDelete("/g/3")).Commit(); err != nil {
		log.Fatal(err)
	}
	cancel()
	last := put(direct, "/g/end", "1")

	type form struct {
		name string
		key  string
		opts []clientv3.OpOption
	}
	forms := []form{
		{"key", "/g/1", nil},
		{"prefix", "/g/", []clientv3.OpOption{clientv3.WithPrefix()}},
		{"range", "/g/1", []clientv3.OpOption{clientv3.WithRange("/g/4")}},
		{"from-key", "/g/3", []clientv3.OpOption{clientv3.WithFromKey()}},
		{"prev-kv", "/g/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithPrevKV()}},
		{"no-put", "/g/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterPut()}},
		{"no-delete", "/g/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterDelete()}},
		{"fragment", "/g/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFragment()}},
		{"progress-notify", "/g/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithProgressNotify()}},
		{"created-notify", "/g/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}},
	}
	for _, f := range forms {
		for _, start := range []int64{first + 1, first + 3} {
			opts := append([]clientv3.OpOption{clientv3.WithRev(start)}, f.opts...)
			wctx, wcancel := context.WithCancel(context.Background())
			dch := direct.Watch(wctx, f.key, opts...)
			pch := proxy.Watch(wctx, f.key, opts...)
			// A marker after `last` that every form sees: the forms end at different
			// keys, so wait on each until the last revision they can see and then a
			// quiet second.
			want := drain(dch, last)
			got := drain(pch, last)
			wcancel()
			if !reflect.DeepEqual(got, want) {
				log.Fatalf("watch %s from %d: proxy %v, etcd %v", f.name, start, got, want)
			}
		}
	}
	// A watch from now, with the require-leader metadata.
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	defer wcancel()
	wch := proxy.Watch(wctx, "/g/now", clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		log.Fatalf("no created notification: %+v", wr)
	}
	rev := put(direct, "/g/now", "x")
	evs := collect(wch, rev)
	if len(evs) != 1 || evs[0].Value != "x" {
		log.Fatalf("require-leader watch got %v", evs)
	}
	fmt.Println("OK watches")
}

// drain reads until the channel is quiet: 0.8 s once `until` was seen, 2 s before
// (a form that cannot see `until` ends that way).
func drain(wch clientv3.WatchChan, until int64) []event {
	var out []event
	seen := int64(0)
	for {
		wait := 800 * time.Millisecond
		if seen < until {
			wait = 2 * time.Second
		}
		select {
		case wr, ok := <-wch:
			if !ok {
				return out
			}
			if err := wr.Err(); err != nil {
				log.Fatalf("watch error: %v", err)
			}
			for _, ev := range events(wr) {
				out = append(out, ev)
				if ev.ModRev > seen {
					seen = ev.ModRev
				}
			}
		case <-time.After(wait):
			return out
		}
	}
}

func progress() {
	proxy, direct := connect(*proxyURL, 0), connect(*etcdURL, 0)
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	defer wcancel()
	wch := proxy.Watch(wctx, "/p/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		log.Fatalf("no created notification")
	}
	rev := put(direct, "/p/a", "1")
	if evs := collect(wch, rev); len(evs) != 1 {
		log.Fatalf("got %v", evs)
	}
	other := put(direct, "/elsewhere", "x")
	ctx, cancel := ctxT(5 * time.Second)
	defer cancel()
	if err := proxy.RequestProgress(wctx); err != nil {
		log.Fatalf("RequestProgress: %v", err)
	}
	select {
	case wr := <-wch:
		if !wr.IsProgressNotify() {
			log.Fatalf("expected a progress notification, got %+v", wr)
		}
		if wr.Header.Revision < other {
			log.Fatalf("progress at %d, below the last write %d", wr.Header.Revision, other)
		}
	case <-ctx.Done():
		log.Fatalf("no progress notification")
	}
	fmt.Println("OK progress")
}

func autosync() {
	c := connect(*proxyURL, 300*time.Millisecond)
	ctx, cancel := ctxT(5 * time.Second)
	defer cancel()
	if err := c.Sync(ctx); err != nil {
		log.Fatalf("Sync: %v", err)
	}
	time.Sleep(time.Second)
	eps := c.Endpoints()
	if len(eps) != 1 || eps[0] != *proxyURL {
		log.Fatalf("endpoints after auto-sync: %v, want [%s]", eps, *proxyURL)
	}
	if _, err := c.Get(ctx, "/after-sync"); err != nil {
		log.Fatalf("get after sync: %v", err)
	}
	fmt.Println("OK autosync")
}

func restart() {
	proxy, direct := connect(*proxyURL, 0), connect(*etcdURL, 0)
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	wch := proxy.Watch(wctx, "/r/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		log.Fatalf("no created notification")
	}
	var revs []int64
	var want []int64
	for i := 0; i < 5; i++ {
		want = append(want, put(direct, fmt.Sprintf("/r/%d", i), "before"))
	}
	for len(revs) < 5 {
		wr := <-wch
		for _, e := range wr.Events {
			revs = append(revs, e.Kv.ModRevision)
		}
	}
	stdin := bufio.NewReader(os.Stdin)
	expect := func(word string) {
		line, _ := stdin.ReadString('\n')
		if strings.TrimSpace(line) != word {
			log.Fatalf("unexpected line %q, want %q", line, word)
		}
	}
	fmt.Println("STOP NOW")
	expect("stopped")
	// Written while the proxy is down: older than the restarted cache's first list.
	for i := 0; i < 5; i++ {
		want = append(want, put(direct, fmt.Sprintf("/r/%d", i), "during"))
	}
	fmt.Println("START NOW")
	expect("started")
	for i := 0; i < 5; i++ {
		want = append(want, put(direct, fmt.Sprintf("/r/%d", i), "after"))
	}
	timeout := time.After(30 * time.Second)
	for len(revs) < len(want) {
		select {
		case wr, ok := <-wch:
			if !ok {
				log.Fatalf("watch closed")
			}
			if err := wr.Err(); err != nil {
				log.Fatalf("watch error after restart: %v", err)
			}
			for _, e := range wr.Events {
				revs = append(revs, e.Kv.ModRevision)
			}
		case <-timeout:
			log.Fatalf("after the restart got %v, want %v", revs, want)
		}
	}
	if !reflect.DeepEqual(revs, want) {
		log.Fatalf("revisions %v, want %v (a gap or a duplicate)", revs, want)
	}
	fmt.Println("OK restart")
}

// resolver checks the proxies' registrations the way Go clients read them: etcd's
// endpoints manager lists exactly the wanted addresses, and a gRPC connection resolved
// by etcd's naming resolver reaches a proxy and reads through it.
func resolver() {
	cli := connect(*etcdURL, 0)
	defer cli.Close()
	em, err := endpoints.NewManager(cli, *prefix)
	if err != nil {
		log.Fatalf("endpoints manager: %v", err)
	}
	ctx, cancel := ctxT(10 * time.Second)
	defer cancel()
	eps, err := em.List(ctx)
	if err != nil {
		log.Fatalf("list endpoints: %v", err)
	}
	var got []string
	for _, ep := range eps {
		got = append(got, ep.Addr)
	}
	want := strings.Split(*wantEPs, ",")
	sortStrings(got)
	sortStrings(want)
	if !reflect.DeepEqual(got, want) {
		log.Fatalf("registered %v, want %v", got, want)
	}
	conn := resolvedConn(cli)
	defer conn.Close()
	kv := pb.NewKVClient(conn)
	for i := 0; i < 2*len(want); i++ {
		if _, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("/resolved")}); err != nil {
			log.Fatalf("range through a resolved proxy: %v", err)
		}
	}
	fmt.Println("OK resolver")
}

// resolverWatch: clientv3's watcher over a gRPC connection that etcd's naming resolver
// keeps pointed at the live registered proxies (round robin). When the proxy carrying
// the watch stream dies, the watcher opens a new stream (on another proxy) and resumes
// from the revision after the last event it delivered: every put must arrive once, in
// order.
func resolverWatch() {
	cli := connect(*etcdURL, 0)
	defer cli.Close()
	conn := resolvedConn(cli)
	defer conn.Close()
	w := clientv3.NewWatchFromWatchClient(pb.NewWatchClient(conn), cli)
	defer w.Close()
	ctx, cancel := ctxT(90 * time.Second)
	defer cancel()
	wch := w.Watch(ctx, *watchKey, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if first, ok := <-wch; !ok || !first.Created {
		log.Fatalf("no created response: %v", first.Err())
	}
	fmt.Println("READY")
	next, last := 0, int64(0)
	for next < *count {
		wr, ok := <-wch
		if !ok {
			log.Fatalf("the watch ended after %d of %d events: %v", next, *count, ctx.Err())
		}
		if err := wr.Err(); err != nil {
			log.Fatalf("the watch failed after %d of %d events: %v", next, *count, err)
		}
		for _, e := range wr.Events {
			want := fmt.Sprintf("%s%04d", *watchKey, next)
			if string(e.Kv.Key) != want || e.Kv.ModRevision <= last {
				log.Fatalf("event %d: %s at revision %d, want %s after revision %d (a gap or a duplicate)",
					next, e.Kv.Key, e.Kv.ModRevision, want, last)
			}
			next, last = next+1, e.Kv.ModRevision
		}
	}
	fmt.Println("OK resolver-watch")
}

// resolvedConn is a gRPC connection that etcd's naming resolver (over -prefix, read
// through cli) keeps on the live registered proxies, round robin.
func resolvedConn(cli *clientv3.Client) *grpc.ClientConn {
	b, err := etcdresolver.NewBuilder(cli)
	if err != nil {
		log.Fatalf("resolver: %v", err)
	}
	conn, err := grpc.NewClient("etcd:///"+*prefix, grpc.WithResolvers(b),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingPolicy":"round_robin"}`))
	if err != nil {
		log.Fatalf("dial through the resolver: %v", err)
	}
	return conn
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	switch flag.Arg(0) {
	case "watches":
		watches()
	case "progress":
		progress()
	case "autosync":
		autosync()
	case "restart":
		restart()
	case "resolver":
		resolver()
	case "resolver-watch":
		resolverWatch()
	default:
		log.Fatalf("unknown mode %q", flag.Arg(0))
	}
}
