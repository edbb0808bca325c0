// Command gotest drives Go's clientv3 through etcd-cache-proxy. It is built and run by
// proxy/tests/go_client.rs, which starts etcd and the proxy.
//
//	gotest -proxy URL -etcd URL watches     every watch option, through the proxy vs etcd
//	gotest -proxy URL -etcd URL progress    RequestProgress and WithRequireLeader
//	gotest -proxy URL -etcd URL autosync    endpoint auto-sync stays on the proxy
//	gotest -proxy URL -etcd URL restart     a watch that lives through a proxy restart
//	gotest -proxy URL -etcd URL pipeline    raw etcdserverpb stubs on one connection each:
//	                                        3,000 progress requests, 10,000 creates and
//	                                        10,000 cancels pipelined on one Watch stream
//	                                        (each message in its own DATA frame), sent to
//	                                        etcd and to the proxy, answers compared, with
//	                                        unary calls on the same connection meanwhile
//	gotest -proxy URL -etcd URL authority  raw etcdserverpb stubs dialed with the
//	                                        endpoint URL, scheme and all, as the HTTP/2
//	                                        :authority (as clientv3 3.4 sends it for
//	                                        Status and HashKV): Status, HashKV and Range
//	                                        answer through the proxy as from etcd
//	gotest -proxy URL -conns C -streams S flood
//	                                        a hostile client: C connections, each with S
//	                                        Watch streams, each sent a full 64 KiB stream
//	                                        window of progress requests cut into 1-byte
//	                                        DATA frames, nothing read; prints what each
//	                                        connection ended with
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
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"reflect"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/naming/endpoints"
	etcdresolver "go.etcd.io/etcd/client/v3/naming/resolver"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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
	conns    = flag.Int("conns", 1, "connections (flood mode)")
	streams  = flag.Int("streams", 1, "Watch streams per connection (flood mode)")
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
	case "pipeline":
		pipeline()
	case "flood":
		flood()
	case "authority":
		authority()
	default:
		log.Fatalf("unknown mode %q", flag.Arg(0))
	}
}

// Sizes of the pipeline mode (the figures).
const (
	pipelinedProgress = 3000
	pipelinedCreates  = 10000
)

// pipelineAnswers is what one endpoint answered to the pipelined stream.
type pipelineAnswers struct {
	Created  int   // created responses
	Canceled int   // canceled responses
	Progress int   // progress responses (no events, not created or canceled)
	Events   int   // events seen (the fence's only)
	IDs      int64 // sum of the created ids, as the ids given must agree
	Unary    int   // unary calls that succeeded on the same connection meanwhile
	Elapsed  time.Duration
}

// pipelineOn sends the pipelined stream to endpoint over one grpc-go connection and
// collects the answers, with unary Range calls on the same connection until the last
// answer came.
func pipelineOn(endpoint string) pipelineAnswers {
	conn, err := grpc.NewClient(strings.TrimPrefix(endpoint, "http://"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("dial %s: %v", endpoint, err)
	}
	defer conn.Close()
	kv, w := pb.NewKVClient(conn), pb.NewWatchClient(conn)
	ctx, cancel := ctxT(60 * time.Second)
	defer cancel()
	// The connection is up before the clock starts.
	if _, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("/app/pf")}); err != nil {
		log.Fatalf("%s: first Range: %v", endpoint, err)
	}
	stream, err := w.Watch(ctx)
	if err != nil {
		log.Fatalf("%s: Watch: %v", endpoint, err)
	}
	start := time.Now()
	wantCreated := pipelinedCreates + 2
	var got pipelineAnswers
	done := make(chan error, 1)
	// Every create and cancel answered: then a put on /app/pf (watch 0) is the fence,
	// behind every progress answer that etcd (or the proxy) gives. etcd from 3.6 on
	// answers a progress request that comes while the last one's answer is still queued
	// with that answer, so the count of progress answers is etcd's to choose.
	answered := make(chan struct{})
	go func() {
		for got.Events == 0 {
			r, err := stream.Recv()
			if err != nil {
				done <- fmt.Errorf("after %+v: %v", got, err)
				return
			}
			switch {
			case r.Created:
				got.Created++
				got.IDs += r.WatchId
			case r.Canceled:
				got.Canceled++
			case len(r.Events) == 0:
				got.Progress++
			default:
				got.Events += len(r.Events)
			}
			if got.Created == wantCreated && got.Canceled == pipelinedCreates && answered != nil {
				close(answered)
				answered = nil
			}
		}
		done <- nil
	}()
	// Unary calls on the same connection while the stream is pipelined and answered.
	unary := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				if n == 0 {
					unary <- fmt.Errorf("no unary call finished while the stream was answered")
					return
				}
				got.Unary = n
				unary <- nil
				return
			default:
			}
			if _, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("/app/pf")}); err != nil {
				unary <- fmt.Errorf("unary Range on the same connection: %v", err)
				return
			}
			n++
			time.Sleep(5 * time.Millisecond)
		}
	}()
	create := func(key string) *pb.WatchRequest {
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{
			CreateRequest: &pb.WatchCreateRequest{Key: []byte(key)}}}
	}
	send := func(r *pb.WatchRequest) {
		if err := stream.Send(r); err != nil {
			// io.EOF: the stream ended; the reader has its status.
			log.Fatalf("%s: send: %v (the stream: %v)", endpoint, err, <-done)
		}
	}
	// One watch the proxy serves from its cache (/app/), one it forwards (/o/).
	send(create("/app/pf"))
	send(create("/o/pf"))
	for i := 0; i < pipelinedProgress; i++ {
		send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{
			ProgressRequest: &pb.WatchProgressRequest{}}})
	}
	for i := 0; i < pipelinedCreates; i++ {
		send(create(fmt.Sprintf("/app/pc/%d", i)))
	}
	// Ids 2.. are the creates above, in order (etcd's automatic ids).
	for i := 0; i < pipelinedCreates; i++ {
		send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{
			CancelRequest: &pb.WatchCancelRequest{WatchId: int64(i + 2)}}})
	}
	select {
	case <-answered:
	case err := <-done:
		log.Fatalf("%s: the pipelined stream failed: %v", endpoint, err)
	}
	if _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("/app/pf"), Value: []byte("fence")}); err != nil {
		log.Fatalf("%s: the fence's put: %v", endpoint, err)
	}
	if err := <-done; err != nil {
		log.Fatalf("%s: the pipelined stream failed: %v", endpoint, err)
	}
	got.Elapsed = time.Since(start)
	close(stop)
	if err := <-unary; err != nil {
		log.Fatalf("%s: %v", endpoint, err)
	}
	// Still usable afterwards: the connection was never closed.
	if _, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("/app/pf")}); err != nil {
		log.Fatalf("%s: Range after the stream: %v", endpoint, err)
	}
	if err := conn.GetState(); err.String() != "READY" {
		log.Fatalf("%s: connection state %v after the stream", endpoint, err)
	}
	_ = stream.CloseSend()
	return got
}

func pipeline() {
	direct := pipelineOn(*etcdURL)
	proxied := pipelineOn(*proxyURL)
	fmt.Printf("etcd:  %+v\nproxy: %+v\n", direct, proxied)
	for _, g := range []pipelineAnswers{direct, proxied} {
		want := int64(pipelinedCreates+1) * int64(pipelinedCreates+2) / 2 // 0 + 1 + ... + 10,001
		if g.Created != pipelinedCreates+2 || g.Canceled != pipelinedCreates ||
			g.Progress < 1 || g.Progress > pipelinedProgress || g.Events != 1 || g.IDs != want {
			log.Fatalf("unexpected answers %+v (created ids sum to %d)", g, want)
		}
	}
	// Where etcd answers every progress request (3.4, 3.5), so does the proxy.
	if direct.Progress == pipelinedProgress && proxied.Progress != pipelinedProgress {
		log.Fatalf("etcd answered %d progress requests, the proxy %d", direct.Progress, proxied.Progress)
	}
	fmt.Println("OK pipeline")
}

// floodConn opens one HTTP/2 connection to addr by hand and sends, on each of its
// streams, a stream window (65,535 bytes) of WatchProgressRequests cut into 1-byte DATA
// frames, reading nothing but the frames it must answer (SETTINGS). It returns how the
// connection ended: "open" if the server kept it, or the GOAWAY it sent.
func floodConn(addr string, streams int) string {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		log.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		log.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		log.Fatal(err)
	}
	ended := make(chan string, 1)
	acks := make(chan struct{}, 16)
	go func() {
		r := http2.NewFramer(nil, c)
		for {
			f, err := r.ReadFrame()
			if err != nil {
				ended <- "closed: " + err.Error()
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					acks <- struct{}{}
				}
			case *http2.GoAwayFrame:
				ended <- fmt.Sprintf("GOAWAY %v %q", f.ErrCode, f.DebugData())
				return
			}
		}
	}()
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	headers := func() []byte {
		hbuf.Reset()
		for _, h := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":path", "/etcdserverpb.Watch/Watch"},
			{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"},
		} {
			_ = enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
		}
		return append([]byte(nil), hbuf.Bytes()...)
	}
	// The framer is not safe for concurrent writes: the SETTINGS ack goes between frames.
	ack := func() {
		for {
			select {
			case <-acks:
				if err := fr.WriteSettingsAck(); err != nil {
					return
				}
			default:
				return
			}
		}
	}
	progress := []byte{0, 0, 0, 0, 2, 0x22, 0}
	const window = 65535
	for s := 0; s < streams; s++ {
		id := uint32(2*s + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headers(), EndHeaders: true}); err != nil {
			return "closed while sending: " + err.Error()
		}
	}
	for i := 0; i < window; i++ {
		ack()
		for s := 0; s < streams; s++ {
			if err := fr.WriteData(uint32(2*s+1), false, progress[i%len(progress):i%len(progress)+1]); err != nil {
				select {
				case e := <-ended:
					return e
				default:
					return "closed while sending: " + err.Error()
				}
			}
		}
	}
	// Whatever the server does with it, it does within a second of the last frame.
	select {
	case e := <-ended:
		return e
	case <-time.After(time.Second):
		return "open"
	}
}

func flood() {
	addr := strings.TrimPrefix(*proxyURL, "http://")
	results := make(chan string, *conns)
	for i := 0; i < *conns; i++ {
		go func() { results <- floodConn(addr, *streams) }()
	}
	for i := 0; i < *conns; i++ {
		fmt.Println("FLOOD", <-results)
	}
	fmt.Println("OK flood")
}

// authorityAnswers is what one side answered to a connection whose :authority is the
// endpoint URL: the server's version, the KV hash, and whether a Range was answered.
type authorityAnswers struct {
	Version string
	Hash    uint32
	Ranged  bool
}

func authorityOn(endpoint string) (authorityAnswers, error) {
	var a authorityAnswers
	conn, err := grpc.NewClient(strings.TrimPrefix(endpoint, "http://"),
		grpc.WithAuthority(endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return a, fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	ctx, cancel := ctxT(10 * time.Second)
	defer cancel()
	m := pb.NewMaintenanceClient(conn)
	st, err := m.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return a, fmt.Errorf("Status: %w", err)
	}
	a.Version = st.Version
	h, err := m.HashKV(ctx, &pb.HashKVRequest{})
	if err != nil {
		return a, fmt.Errorf("HashKV: %w", err)
	}
	a.Hash = h.Hash
	if _, err := pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte("health")}); err != nil {
		return a, fmt.Errorf("Range: %w", err)
	}
	a.Ranged = true
	return a, nil
}

func authority() {
	want, err := authorityOn(*etcdURL)
	if err != nil {
		log.Fatalf("etcd: %v", err)
	}
	got, err := authorityOn(*proxyURL)
	if err != nil {
		log.Fatalf("proxy (etcd answered %+v): %v", want, err)
	}
	if got != want {
		log.Fatalf("proxy answered %+v, etcd %+v", got, want)
	}
	fmt.Printf("both answered %+v\n", got)
	fmt.Println("OK authority")
}
