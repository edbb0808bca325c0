// Command etcd is what etcd's e2e framework runs as `<bin-dir>/etcd`.
//
// `etcd grpc-proxy start <flags>` starts etcd-cache-proxy instead, with grpc-proxy's flags
// translated to etcd-cache-proxy's (flags it has no counterpart for are dropped, and each drop
// is logged); once the proxy logs that it serves, the wrapper prints grpc-proxy's ready line
// "started gRPC proxy", which the framework waits for. Anything else runs the real etcd
// (exec'd, so it behaves exactly as etcd).
//
// Environment (each also as ETCD_<NAME>, e.g. ETCD_E2E_PROXY: etcd's framework passes only
// ETCD_*, ETCDCTL_*, EXPECT_* and PATH to the processes it starts, so run.sh sets those):
//
//	E2E_PROXY            cache (default): etcd-cache-proxy; grpc-proxy: the real
//	                     `etcd grpc-proxy` (the reference run)
//	E2E_REAL_ETCD        the real etcd (default: etcd-real beside this binary)
//	ETCD_CACHE_PROXY_BIN etcd-cache-proxy (default /work/main/target/debug/etcd-cache-proxy)
//	E2E_PROXY_LOG_DIR    when set, each proxy's output (and the translated command line) is
//	                     also written to a file there, named <listen-port>-<pid>.log
//	E2E_PROXY_ARGS       extra arguments for etcd-cache-proxy, space separated
//	E2E_PROXY_READY_TIMEOUT  how long a proxy may take to serve before the wrapper kills it
//	                     and exits 3 (default 30s; etcd's framework would wait forever)
//
// Variables named E2E_*, ETCD_E2E_* and ETCD_CACHE_PROXY_BIN are removed from the environment
// of the real etcd (etcd reads every ETCD_<FLAG> variable as a flag).
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.uber.org/zap"
)

const readyLine = "started gRPC proxy"

// What etcd-cache-proxy logs once it listens.
const cacheServing = "serving etcd's v3 gRPC API"

func main() {
	args := os.Args[1:]
	isProxy := len(args) >= 2 && args[0] == "grpc-proxy" && args[1] == "start"
	mode := getenv("E2E_PROXY")
	if !isProxy {
		execRealEtcd(args)
	}
	switch mode {
	case "", "cache", "etcd-cache-proxy":
		runCacheProxy(args[2:])
	case "grpc-proxy", "grpcproxy", "reference":
		runGrpcProxy(args)
	default:
		fatalf("E2E_PROXY=%q: want cache or grpc-proxy", mode)
	}
}

// getenv reads E2E_<X>, else ETCD_E2E_<X>.
func getenv(name string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return os.Getenv("ETCD_" + name)
}

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "e2e etcd wrapper: "+format+"\n", a...)
	os.Exit(2)
}

func realEtcd() string {
	if p := getenv("E2E_REAL_ETCD"); p != "" {
		return p
	}
	self, err := os.Executable()
	if err != nil {
		fatalf("cannot find myself: %v", err)
	}
	return filepath.Join(filepath.Dir(self), "etcd-real")
}

// cleanEnv is the environment without this harness's variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "E2E_") || strings.HasPrefix(kv, "ETCD_E2E_") || strings.HasPrefix(kv, "ETCD_CACHE_PROXY_BIN=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func execRealEtcd(args []string) {
	bin := realEtcd()
	argv := append([]string{bin}, args...)
	if err := syscall.Exec(bin, argv, cleanEnv()); err != nil {
		fatalf("exec %s: %v", bin, err)
	}
}

// flagValue splits `--name=value` / `--name value`; i is advanced past what was consumed.
type parsedFlag struct {
	name  string
	value string
	has   bool
}

// grpc-proxy's boolean flags (etcd v3.6 `etcd grpc-proxy start --help`).
var boolFlags = map[string]bool{
	"auto-tls": true, "insecure-skip-tls-verify": true, "insecure-discovery": true,
	"debug": true, "enable-pprof": true, "experimental-serializable-ordering": true,
	"experimental-enable-grpc-logging": true, "enable-grpc-logging": true,
	"serializable-ordering": true, "client-cert-auth": true, "peer-auto-tls": true,
}

func parseFlags(args []string) []parsedFlag {
	var out []parsedFlag
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			out = append(out, parsedFlag{name: "", value: a, has: true})
			continue
		}
		name := strings.TrimLeft(a, "-")
		if k, v, ok := strings.Cut(name, "="); ok {
			out = append(out, parsedFlag{name: k, value: v, has: true})
			continue
		}
		if boolFlags[name] {
			out = append(out, parsedFlag{name: name, value: "true", has: true})
			continue
		}
		if i+1 < len(args) {
			out = append(out, parsedFlag{name: name, value: args[i+1], has: true})
			i++
		} else {
			out = append(out, parsedFlag{name: name})
		}
	}
	return out
}

type proxyCmd struct {
	bin    string
	args   []string
	notes  []string // what the translation did, logged first
	listen string
}

func translate(in []string) proxyCmd {
	c := proxyCmd{bin: os.Getenv("ETCD_CACHE_PROXY_BIN")}
	if c.bin == "" {
		c.bin = "/work/main/target/debug/etcd-cache-proxy"
	}
	note := func(format string, a ...any) { c.notes = append(c.notes, fmt.Sprintf(format, a...)) }
	set := func(name, value string) { c.args = append(c.args, "--"+name+"="+value) }
	flags := parseFlags(in)
	autoTLS, skipVerify := false, false
	// grpc-proxy (etcd's Go client) ignores --cacert/--cert/--key when every endpoint is
	// http://; etcd-cache-proxy refuses that at start (tokens would travel in clear), so
	// the wrapper drops them as grpc-proxy ignores them.
	plainEndpoints := false
	for _, f := range flags {
		switch f.name {
		case "endpoints":
			plainEndpoints = true
			for _, e := range strings.Split(f.value, ",") {
				if !strings.HasPrefix(strings.TrimSpace(e), "http://") {
					plainEndpoints = false
				}
			}
		case "auto-tls":
			autoTLS = f.value != "false"
		case "insecure-skip-tls-verify":
			skipVerify = f.value != "false"
		}
	}
	for _, f := range flags {
		switch f.name {
		case "endpoints", "namespace", "cert", "key", "cacert", "cert-file", "key-file",
			"trusted-ca-file", "client-crl-file", "max-send-bytes", "max-recv-bytes",
			"endpoints-auto-sync-interval", "tls-min-version", "tls-max-version":
			if plainEndpoints && (f.name == "cacert" || f.name == "cert" || f.name == "key") {
				note("--%s=%s with http:// endpoints: grpc-proxy ignores it, etcd-cache-proxy refuses it; dropped", f.name, f.value)
				continue
			}
			set(f.name, f.value)
		case "listen-addr":
			// grpc-proxy takes host:port with a host name; etcd-cache-proxy a socket address.
			v := f.value
			if host, port, err := net.SplitHostPort(v); err == nil && host == "localhost" {
				v = net.JoinHostPort("127.0.0.1", port)
				note("--listen-addr=%s: as %s (etcd-cache-proxy takes an IP address)", f.value, v)
			}
			c.listen = v
			set(f.name, v)
		case "advertise-client-url":
			if f.value == "" {
				note("--advertise-client-url='' (grpc-proxy: pass member RPCs through to etcd): etcd-cache-proxy has no such mode; dropped")
				continue
			}
			set(f.name, f.value)
		case "metrics-addr":
			// grpc-proxy takes a URL, etcd-cache-proxy an address.
			v := f.value
			if u, err := url.Parse(v); err == nil && u.Host != "" {
				v = u.Host
			}
			if host, port, err := net.SplitHostPort(v); err == nil && host == "localhost" {
				v = net.JoinHostPort("127.0.0.1", port)
			}
			set("metrics-addr", v)
		case "data-dir":
			note("--data-dir=%s: etcd-cache-proxy keeps no data; dropped", f.value)
		case "insecure-skip-tls-verify":
			if skipVerify {
				c.args = append(c.args, "--"+f.name)
			}
		case "auto-tls":
			if !autoTLS {
				continue
			}
			// grpc-proxy serves clients a self-signed certificate it makes; make one the
			// same way (etcd's transport.SelfCert) and serve it.
			dir, err := os.MkdirTemp("", "e2e-cache-proxy-autotls-")
			if err != nil {
				fatalf("auto-tls: %v", err)
			}
			info, err := transport.SelfCert(zap.NewNop(), dir, []string{"localhost", "127.0.0.1"}, 1)
			if err != nil {
				fatalf("auto-tls: %v", err)
			}
			note("--auto-tls: no such flag; serving a self-signed certificate made like etcd's (%s)", info.CertFile)
			set("cert-file", info.CertFile)
			set("key-file", info.KeyFile)
		case "":
			note("argument %q: dropped", f.value)
		default:
			if f.has {
				note("--%s=%s: etcd-cache-proxy has no such flag; dropped", f.name, f.value)
			} else {
				note("--%s: etcd-cache-proxy has no such flag; dropped", f.name)
			}
		}
	}
	if extra := strings.Fields(getenv("E2E_PROXY_ARGS")); len(extra) > 0 {
		note("E2E_PROXY_ARGS: %s", strings.Join(extra, " "))
		c.args = append(c.args, extra...)
	}
	return c
}

// logFile opens <E2E_PROXY_LOG_DIR>/<port>-<pid>.log, or returns nil.
func logFile(listen, kind string) *os.File {
	dir := getenv("E2E_PROXY_LOG_DIR")
	if dir == "" {
		return nil
	}
	_ = os.MkdirAll(dir, 0o755)
	port := listen
	if _, p, err := net.SplitHostPort(listen); err == nil {
		port = p
	}
	name := fmt.Sprintf("%s-%s-%d.log", time.Now().Format("150405.000"), port, os.Getpid())
	if kind != "" {
		name = kind + "-" + name
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e etcd wrapper: cannot write proxy log: %v\n", err)
		return nil
	}
	return f
}

func runCacheProxy(in []string) {
	c := translate(in)
	if _, err := os.Stat(c.bin); err != nil {
		fatalf("etcd-cache-proxy: %v (set ETCD_CACHE_PROXY_BIN, or build it: cargo build -p etcd-cache-proxy)", err)
	}
	log := logFile(c.listen, "cache")
	var out io.Writer = os.Stdout
	if log != nil {
		defer log.Close()
		out = io.MultiWriter(os.Stdout, log)
	}
	fmt.Fprintf(out, "e2e etcd wrapper: grpc-proxy start %s\n", strings.Join(in, " "))
	for _, n := range c.notes {
		fmt.Fprintf(out, "e2e etcd wrapper: %s\n", n)
	}
	fmt.Fprintf(out, "e2e etcd wrapper: exec %s %s\n", c.bin, strings.Join(c.args, " "))
	env := cleanEnv()
	run(c.bin, c.args, env, out, func(line string) bool { return strings.Contains(line, cacheServing) }, true)
}

func runGrpcProxy(args []string) {
	listen := ""
	for _, f := range parseFlags(args[2:]) {
		if f.name == "listen-addr" {
			listen = f.value
		}
	}
	log := logFile(listen, "grpc")
	var out io.Writer = os.Stdout
	if log != nil {
		defer log.Close()
		out = io.MultiWriter(os.Stdout, log)
	}
	bin := realEtcd()
	fmt.Fprintf(out, "e2e etcd wrapper: exec %s %s\n", bin, strings.Join(args, " "))
	run(bin, args, cleanEnv(), out, func(line string) bool { return strings.Contains(line, readyLine) }, false)
}

// run starts bin, copies its stdout and stderr to out line by line (printing readyLine once
// after the first line for which ready is true, when announce), forwards SIGTERM/SIGINT to it,
// and exits as it exits. A child not ready within E2E_PROXY_READY_TIMEOUT is killed. The child
// dies with the wrapper (Pdeathsig), so a killed test leaves no proxy behind.
func run(bin string, args, env []string, out io.Writer, ready func(string) bool, announce bool) {
	readyTimeout := 30 * time.Second
	if v := getenv("E2E_PROXY_READY_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fatalf("E2E_PROXY_READY_TIMEOUT=%q: %v", v, err)
		}
		readyTimeout = d
	}
	isReady := make(chan struct{})
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw, err := os.Pipe()
	if err != nil {
		fatalf("pipe: %v", err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	if err := cmd.Start(); err != nil {
		fatalf("start %s: %v", bin, err)
	}
	pw.Close()
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		announced := false
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			fmt.Fprintln(out, line)
			if !announced && ready(line) {
				announced = true
				close(isReady)
				if announce {
					fmt.Fprintln(out, readyLine)
				}
			}
			mu.Unlock()
		}
	}()
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	timedOut := false
	exited := make(chan struct{})
	go func() {
		select {
		case <-isReady:
		case <-exited:
		case <-time.After(readyTimeout):
			mu.Lock()
			timedOut = true
			fmt.Fprintf(out, "e2e etcd wrapper: %s did not serve within %s (E2E_PROXY_READY_TIMEOUT); killing it\n", filepath.Base(bin), readyTimeout)
			mu.Unlock()
			_ = cmd.Process.Kill()
		}
	}()
	err = cmd.Wait()
	close(exited)
	<-done
	mu.Lock()
	if timedOut {
		os.Exit(3)
	}
	mu.Unlock()
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
		mu.Lock()
		fmt.Fprintf(out, "e2e etcd wrapper: %s exited: %v\n", filepath.Base(bin), err)
		mu.Unlock()
	}
	os.Exit(code)
}
