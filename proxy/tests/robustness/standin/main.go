// Command etcd is the `etcd` that etcd's robustness suite (robustness.test, built without the
// cluster_proxy tag) runs from its --bin-dir.
//
// A member start (arguments with --listen-client-urls) runs the real etcd with its client
// listener moved to a free port on 127.0.0.1, and serves the member's client URL (the one the
// framework gave, which etcd still advertises) with a proxy pointed at the moved listener: the
// suite's traffic, watches, health checks and failpoint clients all go through the proxy.
// Anything else (--version, --help, ...) execs the real etcd.
//
// The proxy and etcd die with this process (Pdeathsig SIGKILL): the framework's Kill (SIGKILL
// of this process) takes the member and its proxy down together, and its restart starts both
// again. SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGCONT are forwarded to etcd; once etcd exits the proxy
// is stopped (SIGTERM, then SIGKILL after 3 s) and this process exits with etcd's status.
// etcd's lines "ready to serve client requests" are held back until the proxy serves, so the
// framework starts its traffic only once the member's client URL answers. A proxy that exits
// while etcd runs is started again (logged).
//
// Environment (etcd's framework passes only ETCD_*, ETCDCTL_*, EXPECT_* and PATH on; these are
// removed before etcd starts, since etcd reads ETCD_<FLAG> as flags):
//
//	ETCD_ROBUSTNESS_TARGET       cache (default): etcd-cache-proxy; grpc-proxy: the real
//	                             `etcd grpc-proxy start` (the reference front); etcd: no
//	                             front, exec the real etcd unchanged (the reference run)
//	ETCD_ROBUSTNESS_REAL_ETCD    the real etcd (default: etcd-real beside this binary)
//	ETCD_ROBUSTNESS_PROXY_BIN    etcd-cache-proxy (default /work/main/target/release/etcd-cache-proxy)
//	ETCD_ROBUSTNESS_PROXY_ARGS   extra arguments for etcd-cache-proxy, space separated
//	ETCD_ROBUSTNESS_RUST_LOG     RUST_LOG for etcd-cache-proxy (e.g. etcd_cache=debug)
//	ETCD_ROBUSTNESS_LOG_DIR      each proxy's output goes to a file there
//	                             (<cache|grpc>-<member>-<time>-<pid>.log); without it, to stderr
//	ETCD_ROBUSTNESS_ADVERTISE    etcd (default): etcd advertises its moved listener; front: etcd
//	                             advertises the member's original client URL (the proxy's)
//	ETCD_ROBUSTNESS_PROXY_KILL_EVERY  a duration: kill -9 the proxy alone at random intervals
//	                             of about this (uniform in [d/2, 3d/2]) and start it again, the
//	                             member untouched (our own failpoint; clients resume through it)
package main

import (
	"bufio"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	etcdReadyLine = "ready to serve client requests"
	cacheServing  = "serving etcd's v3 gRPC API"
	grpcServing   = "started gRPC proxy"
	prefix        = "robustness stand-in: "
)

func getenv(name string) string { return os.Getenv("ETCD_ROBUSTNESS_" + name) }

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, prefix+format+"\n", a...)
	os.Exit(2)
}

// out serialises everything written to stdout (etcd's lines and ours).
var outMu sync.Mutex

func say(format string, a ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(os.Stdout, prefix+format+"\n", a...)
}

func realEtcd() string {
	if p := getenv("REAL_ETCD"); p != "" {
		return p
	}
	self, err := os.Executable()
	if err != nil {
		fatalf("cannot find myself: %v", err)
	}
	return filepath.Join(filepath.Dir(self), "etcd-real")
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ETCD_ROBUSTNESS_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func execRealEtcd(args []string) {
	bin := realEtcd()
	if err := syscall.Exec(bin, append([]string{bin}, args...), cleanEnv()); err != nil {
		fatalf("exec %s: %v", bin, err)
	}
}

func main() {
	// Pdeathsig is sent when the thread that started the child exits: keep every child's
	// start on this thread, which lives as long as the process.
	runtime.LockOSThread()
	args := os.Args[1:]
	target := getenv("TARGET")
	if target == "" {
		target = "cache"
	}
	li := flagIndex(args, "listen-client-urls")
	if li < 0 || target == "etcd" {
		execRealEtcd(args)
	}
	if target != "cache" && target != "grpc-proxy" {
		fatalf("ETCD_ROBUSTNESS_TARGET=%q: want cache, grpc-proxy or etcd", target)
	}
	_, listenVal := splitFlag(args[li])
	orig, err := url.Parse(listenVal)
	if err != nil || strings.Contains(listenVal, ",") || orig.Scheme != "http" {
		fatalf("--listen-client-urls=%s: only one http:// URL is supported", listenVal)
	}
	host, port, err := net.SplitHostPort(orig.Host)
	if err != nil {
		fatalf("--listen-client-urls=%s: %v", listenVal, err)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	frontAddr := net.JoinHostPort(host, port)
	moved := freePort()
	movedURL := "http://127.0.0.1:" + moved
	args = append([]string(nil), args...)
	args[li] = "--listen-client-urls=" + movedURL
	// etcd advertises where it listens, as a member behind a proxy does in a deployment: the
	// proxy learns each member's version through MemberList's client URLs (advertising the
	// front's URL made the proxy ask itself, before it served, and distrust progress answers).
	// MemberList passes through the proxy as etcd answers it (names and IDs, which the
	// suite's member-replace failpoint reads); the suite's clients never sync endpoints.
	// ETCD_ROBUSTNESS_ADVERTISE=front keeps the front's URL advertised instead.
	if getenv("ADVERTISE") != "front" {
		if ai := flagIndex(args, "advertise-client-urls"); ai >= 0 {
			args[ai] = "--advertise-client-urls=" + movedURL
		}
	}
	name := "member"
	if ni := flagIndex(args, "name"); ni >= 0 {
		_, name = splitFlag(args[ni])
	}
	say("%s: etcd's client listener moved to %s; %s serves %s", name, movedURL, target, frontAddr)

	// After a Kill the framework starts the member again as soon as this process is gone,
	// but the etcd and proxy it killed (Pdeathsig) may still hold the member's ports for a
	// moment (the gofail port's "bind: address already in use" failed a restart): wait until
	// they are free.
	waitFree(name, memberAddrs(args, frontAddr), 10*time.Second)

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGCONT)

	proxyReady := make(chan struct{})
	var readyOnce sync.Once
	markReady := func() { readyOnce.Do(func() { close(proxyReady) }) }

	// etcd.
	etcd := exec.Command(realEtcd(), args...)
	etcd.Env = cleanEnv()
	etcd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw, err := os.Pipe()
	if err != nil {
		fatalf("pipe: %v", err)
	}
	etcd.Stdout, etcd.Stderr = pw, pw
	if err := etcd.Start(); err != nil {
		fatalf("start etcd: %v", err)
	}
	pw.Close()
	// etcd's output is read without pause into a queue (etcd blocks on a full pipe, and a
	// blocked etcd would never let the proxy serve), and written from it, the ready lines
	// held back until the proxy serves.
	lines := make(chan string, 1<<16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		for line := range lines {
			if strings.Contains(line, etcdReadyLine) {
				select {
				case <-proxyReady:
				case <-time.After(60 * time.Second):
					say("%s: the proxy did not serve within 60 s of etcd being ready; passing etcd's ready line on", name)
					markReady()
				}
			}
			outMu.Lock()
			fmt.Fprintln(os.Stdout, line)
			outMu.Unlock()
		}
	}()

	// The proxy, started (and started again when it exits) on this thread by the loop below.
	type proxyExit struct {
		cmd *exec.Cmd
		err error
	}
	proxyExited := make(chan proxyExit, 1)
	var cur *exec.Cmd
	startProxy := func() {
		cmd, ready, started := proxyCommand(target, name, movedURL, frontAddr)
		err := cmd.Start()
		started()
		if err != nil {
			say("%s: start %s: %v", name, cmd.Path, err)
			go func() { proxyExited <- proxyExit{cmd, err} }()
			return
		}
		cur = cmd
		go func() {
			<-ready
			markReady()
		}()
		go func() { err := cmd.Wait(); proxyExited <- proxyExit{cmd, err} }()
	}
	startProxy()

	etcdExited := make(chan error, 1)
	go func() { <-copied; etcdExited <- etcd.Wait() }()

	var killTick <-chan time.Time
	killEvery, _ := time.ParseDuration(getenv("PROXY_KILL_EVERY"))
	nextKill := func() {
		if killEvery > 0 {
			killTick = time.After(killEvery/2 + time.Duration(rand.Int63n(int64(killEvery)+1)))
		}
	}
	nextKill()
	stopping := false
	for {
		select {
		case s := <-sigs:
			stopping = stopping || s != syscall.SIGCONT
			_ = etcd.Process.Signal(s)
		case <-killTick:
			if cur != nil {
				say("%s: kill -9 of the proxy (pid %d), ETCD_ROBUSTNESS_PROXY_KILL_EVERY=%s", name, cur.Process.Pid, killEvery)
				_ = cur.Process.Kill()
			}
			nextKill()
		case pe := <-proxyExited:
			if pe.cmd != cur && cur != nil {
				continue
			}
			cur = nil
			if stopping {
				continue
			}
			say("%s: the proxy exited (%v); starting it again", name, pe.err)
			time.Sleep(100 * time.Millisecond)
			startProxy()
		case err := <-etcdExited:
			if cur != nil {
				_ = cur.Process.Signal(syscall.SIGTERM)
				select {
				case <-proxyExited:
				case <-time.After(3 * time.Second):
					_ = cur.Process.Kill()
				}
			}
			code := 0
			if err != nil {
				code = 1
				if ee, ok := err.(*exec.ExitError); ok {
					if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
						code = 128 + int(ws.Signal())
					} else {
						code = ee.ExitCode()
					}
				}
			}
			os.Exit(code)
		}
	}
}

// proxyCommand is the front's command, its output going to a log file (WARN/ERROR lines and
// panics also to stdout, prefixed), and a channel closed once it serves.
// The returned func closes this process's end of the output pipe (call it after Start).
func proxyCommand(target, member, movedURL, frontAddr string) (*exec.Cmd, <-chan struct{}, func()) {
	var cmd *exec.Cmd
	var serving string
	kind := "cache"
	if target == "grpc-proxy" {
		kind, serving = "grpc", grpcServing
		cmd = exec.Command(realEtcd(), "grpc-proxy", "start",
			"--endpoints="+strings.TrimPrefix(movedURL, "http://"), "--listen-addr="+frontAddr)
	} else {
		serving = cacheServing
		bin := getenv("PROXY_BIN")
		if bin == "" {
			bin = "/work/main/target/release/etcd-cache-proxy"
		}
		a := []string{"--endpoints=" + movedURL, "--listen-addr=" + frontAddr, "--shutdown-timeout=2s"}
		a = append(a, strings.Fields(getenv("PROXY_ARGS"))...)
		cmd = exec.Command(bin, a...)
	}
	// GOFAIL_HTTP is the member's failpoint endpoint: a gofail-enabled `etcd grpc-proxy`
	// would bind it first and the member would fail to start.
	for _, kv := range cleanEnv() {
		if !strings.HasPrefix(kv, "GOFAIL_HTTP=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if v := getenv("RUST_LOG"); v != "" && target == "cache" {
		cmd.Env = append(cmd.Env, "RUST_LOG="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var log io.Writer = os.Stderr
	if dir := getenv("LOG_DIR"); dir != "" {
		_ = os.MkdirAll(dir, 0o755)
		fname := fmt.Sprintf("%s-%s-%s-%d.log", kind, sanitize(member), time.Now().Format("150405.000"), os.Getpid())
		if f, err := os.Create(filepath.Join(dir, fname)); err == nil {
			log = f
		}
	}
	fmt.Fprintf(log, "%s%s %s\n", prefix, cmd.Path, strings.Join(cmd.Args[1:], " "))
	pr, pw, err := os.Pipe()
	if err != nil {
		fatalf("pipe: %v", err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	ready := make(chan struct{})
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
		seen := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(log, line)
			if !seen && strings.Contains(line, serving) {
				seen = true
				close(ready)
			}
			if strings.Contains(line, "WARN") || strings.Contains(line, "ERROR") || strings.Contains(line, "panicked") {
				say("%s: %s: %s", member, kind, line)
			}
		}
		if f, ok := log.(*os.File); ok && f != os.Stderr {
			f.Close()
		}
	}()
	return cmd, ready, func() { pw.Close() }
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

func sanitize(s string) string { return unsafeChars.ReplaceAllString(s, "_") }

func flagIndex(args []string, name string) int {
	for i, a := range args {
		if k, _ := splitFlag(a); k == name {
			return i
		}
	}
	return -1
}

func splitFlag(a string) (string, string) {
	s := strings.TrimLeft(a, "-")
	if len(s) == len(a) {
		return "", a
	}
	k, v, _ := strings.Cut(s, "=")
	return k, v
}

// memberAddrs are the addresses this member's processes listen on at fixed ports: the
// front's, the peer and metrics listeners, and gofail's (GOFAIL_HTTP).
func memberAddrs(args []string, front string) []string {
	addrs := []string{front}
	for _, f := range []string{"listen-peer-urls", "listen-metrics-urls"} {
		if i := flagIndex(args, f); i >= 0 {
			_, v := splitFlag(args[i])
			for _, u := range strings.Split(v, ",") {
				if pu, err := url.Parse(u); err == nil && pu.Host != "" {
					addrs = append(addrs, pu.Host)
				}
			}
		}
	}
	if g := os.Getenv("GOFAIL_HTTP"); g != "" {
		addrs = append(addrs, g)
	}
	return addrs
}

// waitFree waits (at most limit) until every address can be listened on.
func waitFree(member string, addrs []string, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if host == "localhost" {
			host = "127.0.0.1"
		}
		addr := net.JoinHostPort(host, port)
		waited := false
		for {
			l, err := net.Listen("tcp", addr)
			if err == nil {
				l.Close()
				break
			}
			if time.Now().After(deadline) {
				say("%s: %s still in use after %s: %v", member, addr, limit, err)
				break
			}
			waited = true
			time.Sleep(20 * time.Millisecond)
		}
		if waited {
			say("%s: waited for %s to be free", member, addr)
		}
	}
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fatalf("free port: %v", err)
	}
	defer l.Close()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}
