package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/cmd/idem/internal/console"
	"github.com/idemhq/idem/cmd/idem/internal/metrics"
	"github.com/idemhq/idem/cmd/idem/internal/proxy"
)

const proxyAbout = `Runs a reverse proxy that makes any HTTP API retry-safe: it sits in front of
the --upstream service and applies the Idempotency-Key contract with records
in --store. By default POST and PATCH need an Idempotency-Key (400 without);
a retry replays the stored response byte for byte; a duplicate of a running
request gets 409; a reused key with another payload gets 422. Other methods
pass through untouched. Upstream 5xx answers, an unreachable upstream (502)
and a timeout (504) release the key, so a retry runs again. Records are
scoped by a SHA-256 of the Authorization header (--scope-header); a
protected request without it gets 400 proxy.scope_missing, since it cannot
be told apart from another client's. --scope-header none puts every client
in one key space.

A request whose body length could be read two ways (Content-Length with
Transfer-Encoding, and the other means of request smuggling) is refused with
400 proxy.bad_framing and its connection closed; nothing of it is forwarded.
Protected requests ask the upstream for an uncompressed answer, so that a
replay is readable by any retry.

--config FILE (YAML) sets per-route rules (key required/optional/off, TTL,
lease, outcome policy, scope, limits, wait); --check-config FILE validates a
file and exits. See docs/proxy.md.

The proxy answers GET /healthz (the store is reachable; the upstream is not
checked), GET /readyz (the store answers within 1s, as JSON) and GET /metrics
(Prometheus) itself, unless --admin-addr moves them to their own listener;
every other request is forwarded.`

func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("proxy", proxyAbout, stdout, stderr)
	sf := f.serverFlags()
	upstreamURL := f.String("upstream", "", "base URL of the service to protect, such as http://127.0.0.1:9000\n(required)")
	storeSpec := f.String("store", "idem-proxy.db", "where records live: a SQLite file path, a postgres:// URL\n(?idem_schema=NAME picks the schema), a mysql://USER[:PASS]@HOST[:PORT]/DB\nURL (MariaDB; ?idem_table=NAME), a redis:// URL (?prefix=TEXT\nstarts every key), a redis+cluster://host:port,host:port URL (a Redis\nCluster), or memory (this process only)")
	configPath := f.String("config", "", "YAML file with per-route settings (see docs/proxy.md); routes not\nin it use the flags")
	checkPath := f.String("check-config", "", "check the YAML file and exit: 0 when valid, 1 with one\nFILE:LINE:COLUMN: message line per problem")
	adminAddr := f.String("admin-addr", "", "serve /healthz and /metrics on this address instead of the\nproxy's; then every path on --addr is forwarded")
	lease := f.Duration("lease", idem.DefaultLease, "how long a claim holds a key without renewal (renewed while the\nupstream works; after a proxy crash a retry runs again after it)")
	ttl := f.Duration("ttl", idem.DefaultTTL, "how long a record and its response are kept; retries within it replay")
	upstreamTimeout := f.Duration("upstream-timeout", proxy.DefaultUpstreamTimeout, "how long the upstream may take to answer (the whole exchange for\nprotected requests, the response header for others); then 504 and\nthe key is released")
	scopeHeader := f.String("scope-header", proxy.DefaultScopeHeader, "request header whose SHA-256 scopes records (one client's keys\nnever meet another's; a protected request without it gets 400\nproxy.scope_missing); none: one key space for every client")
	encFlags := f.encryptionFlags()
	maxRequest := proxy.SizeFlag(idem.DefaultMaxRequestBody)
	f.Var(&maxRequest, "max-request-body", "largest body of a protected request (413 above it); units KiB, MiB,\nKB, MB...")
	maxResponse := proxy.SizeFlag(idem.DefaultMaxResponseBody)
	f.Var(&maxResponse, "max-response-body", "largest response stored for replay; a larger one reaches the client\nbut a retry gets 409 response_unavailable")
	cf := f.serverConsoleFlags()
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.positional()) > 0 {
		return f.usageError("unexpected argument %q", f.positional()[0])
	}
	if err := positiveDuration("cleanup-interval", *sf.cleanup, true); err != nil {
		return f.usageError("%v", err)
	}
	if err := positiveDuration("shutdown-timeout", *sf.shutdown, false); err != nil {
		return f.usageError("%v", err)
	}
	if err := positiveDuration("store-timeout", *sf.storeTimeout, false); err != nil {
		return f.usageError("%v", err)
	}
	if _, err := backend.KindOf(*storeSpec); err != nil {
		return f.usageError("--store: %v", err)
	}
	base := proxy.DefaultSettings()
	base.Lease, base.TTL, base.Wait, base.UpstreamTimeout = *lease, *ttl, *sf.wait, *upstreamTimeout
	base.ScopeHeader = proxy.ParseScopeHeader(*scopeHeader)
	base.MaxRequestBody, base.MaxResponseBody = int64(maxRequest), int64(maxResponse)
	if err := base.Validate(); err != nil {
		// Settings name fields as the configuration file does; the flags
		// spell them with dashes.
		return f.usageError("--%s", strings.ReplaceAll(err.Error(), "_", "-"))
	}

	if *checkPath != "" {
		return checkProxyConfig(*checkPath, base, stdout, stderr)
	}

	logger, err := newLogger(*sf.logFormat, stderr)
	if err != nil {
		return f.usageError("%v", err)
	}
	if *upstreamURL == "" {
		return f.usageError("--upstream is required: the base URL of the service to protect")
	}
	upstream, err := url.Parse(*upstreamURL)
	if err == nil {
		err = proxy.CheckUpstream(upstream)
	}
	if err != nil {
		return f.usageError("--upstream %q must be an http:// or https:// URL with a host", *upstreamURL)
	}

	var file *proxy.File
	if *configPath != "" {
		if file, err = proxy.LoadFile(*configPath, base); err != nil {
			fmt.Fprintln(stderr, err)
			logger.Error("invalid configuration file; not starting", "config", *configPath)
			return exitError
		}
	}

	consoleToken, err := cf.check("console-addr", *cf.addr, func(msg string) { logger.Warn(msg) })
	if err != nil {
		fmt.Fprintf(stderr, "idem proxy: %v\n", err)
		return exitUsage
	}
	enc, encAttr, err := encFlags.load(logger, longestTTL(*ttl, file))
	if err != nil {
		fmt.Fprintf(stderr, "idem proxy: %v\n", err)
		return exitCodeOf(err)
	}

	store, err := backend.Open(ctx, *storeSpec)
	if err != nil {
		logger.Error("cannot open the store", "store", *storeSpec, "error", err)
		return exitError
	}
	defer closeStore(store, logger)

	m := metrics.New()
	tel, err := startTelemetry(ctx, "idem-proxy", string(store.Kind), logger)
	if err != nil {
		logger.Error("cannot set up OpenTelemetry export", "error", err)
		return exitError
	}
	defer tel.close(logger)
	cfg := &proxy.Config{Upstream: upstream, Store: store.Records, Defaults: base, Metrics: m, Logger: logger, StoreTimeout: *sf.storeTimeout,
		Observer: tel.observer(nil), ProblemBaseURL: *sf.problemBaseURL, Encryption: enc}
	if file != nil {
		cfg.Routes = file.ProxyRoutes()
	}
	px, err := proxy.New(cfg)
	if err != nil {
		logger.Error("cannot start the proxy", "error", err)
		return exitError
	}

	admin := http.NewServeMux()
	admin.Handle("GET /healthz", health(store))
	admin.Handle("GET /readyz", newReadiness(logger, []string{*storeSpec}, storeCheck("store", store)))
	admin.Handle("GET /metrics", m.Handler())
	var handler http.Handler = px
	if *adminAddr == "" {
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || r.URL.Path == "/metrics") {
				admin.ServeHTTP(w, r)
				return
			}
			px.ServeHTTP(w, r)
		})
	}

	ln, err := net.Listen("tcp", *sf.addr)
	if err != nil {
		logger.Error("cannot listen", "addr", *sf.addr, "error", err)
		return exitError
	}
	if selfUpstream(ctx, upstream, ln.Addr()) {
		ln.Close()
		logger.Error("the upstream is the proxy's own address: every request would loop", "upstream", upstream.Redacted(), "addr", ln.Addr().String())
		return exitError
	}
	var adminLn net.Listener
	adminWhere := "/healthz, /readyz and /metrics on the proxy's address (not forwarded)"
	if *adminAddr != "" {
		if adminLn, err = net.Listen("tcp", *adminAddr); err != nil {
			ln.Close()
			logger.Error("cannot listen", "admin_addr", *adminAddr, "error", err)
			return exitError
		}
		adminWhere = "/healthz, /readyz and /metrics on " + adminLn.Addr().String()
	}
	if *cf.addr != "" {
		wait, err := serveConsole(ctx, console.Config{Store: store, Spec: *storeSpec, Rates: m.Rates, Encryption: enc,
			ShowBody: *cf.showBody, Token: consoleToken, TTL: *ttl, Title: "idem proxy", Logger: logger},
			*cf.addr, consoleToken, logger, *sf.accessLog, *sf.shutdown)
		if err != nil {
			ln.Close()
			if adminLn != nil {
				adminLn.Close()
			}
			return exitError
		}
		defer wait()
	}
	routes := 0
	if file != nil {
		routes = len(file.Routes)
	}
	attrs := []any{"addr", ln.Addr().String(), "url", "http://" + ln.Addr().String(),
		"upstream", upstream.Redacted(), "store", store.Where, "admin", adminWhere,
		"config", *configPath, "routes", routes,
		"lease", *lease, "ttl", *ttl, "wait", *sf.wait, "upstream_timeout", *upstreamTimeout, "scope_header", cmp.Or(base.ScopeHeader, proxy.NoScope), encAttr}
	if adminLn != nil {
		attrs = append(attrs, "admin_addr", adminLn.Addr().String())
	}
	logger.Info("idem proxy listening", attrs...)
	if unscoped := unscopedRoutes(base, file); len(unscoped) > 0 {
		logger.Warn("idempotency records are not scoped (scope none): every client shares one key space, so one client's retry can receive another's stored response if they pick the same key",
			"routes", unscoped)
	}

	cctx, stopCleanup := context.WithCancel(ctx)
	defer stopCleanup()
	go cleanupLoop(cctx, store.Records, *sf.cleanup, logger)

	// Both servers stop together: on a signal, or when either fails.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	adminErr := make(chan error, 1)
	if adminLn != nil {
		go func() {
			err := serveHTTP(sctx, adminLn, accessLog(logger, *sf.accessLog, admin), logger, 0, *sf.shutdown)
			stop()
			adminErr <- err
		}()
	} else {
		adminErr <- nil
	}
	// Requests whose length could be read two ways are refused on the
	// connection, before net/http settles them its own way (request
	// smuggling; see proxy.GuardFraming).
	guard := func(srv *http.Server, ln net.Listener) net.Listener { return proxy.GuardFraming(srv, ln, logger) }
	err = serveHTTPWith(sctx, ln, accessLog(logger, *sf.accessLog, tel.handler(handler, "idem proxy")), logger, px.MaxHandlerTime(), *sf.shutdown, guard)
	stop()
	err = errors.Join(err, <-adminErr)
	if err != nil {
		logger.Error("server stopped", "error", err)
		return exitError
	}
	if ctx.Err() == nil {
		return exitError // a server stopped without a signal
	}
	logger.Info("stopped")
	return exitOK
}

// checkProxyConfig implements --check-config: the file's problems on
// stderr (exit 1), or its resolved routes on stdout (exit 0).
func checkProxyConfig(path string, base proxy.Settings, stdout, stderr io.Writer) int {
	file, err := proxy.LoadFile(path, base)
	if err != nil {
		fmt.Fprintln(stderr, err)
		var ce *proxy.ConfigErrors
		if errors.As(err, &ce) {
			fmt.Fprintf(stderr, "%s: %d problem(s); the proxy would not start with this file\n", path, len(ce.Errors))
		}
		return exitError
	}
	fmt.Fprintf(stdout, "%s: ok, %d route(s); requests matching no route use the flags' settings\n", path, len(file.Routes))
	for _, r := range file.Routes {
		s := r.Settings
		key := proxy.KeyName(s.Key)
		if s.Key == idem.KeyByMethod {
			key += " " + strings.Join(s.Methods, ",")
		}
		scope := cmp.Or(s.ScopeHeader, proxy.NoScope)
		fmt.Fprintf(stdout, "  line %d: %s\n    key %s; lease %v; ttl %v; wait %v; upstream timeout %v; scope %s;\n    max request %s; max stored response %s; outcome %s\n    fingerprint %s\n",
			r.Line, r.Pattern, key, s.Lease, s.TTL, s.Wait, s.UpstreamTimeout, scope,
			proxy.FormatSize(s.MaxRequestBody), proxy.FormatSize(s.MaxResponseBody), s.Outcome, fingerprintFields(s))
	}
	return exitOK
}

// fingerprintFields says which parts of a JSON body a route's
// fingerprint covers, for --check-config.
func fingerprintFields(s proxy.Settings) string {
	switch {
	case len(s.FingerprintInclude) > 0:
		return "covers only " + strings.Join(s.FingerprintInclude, ", ") + " (with the method and target)"
	case len(s.FingerprintExclude) > 0:
		return "covers the whole body except " + strings.Join(s.FingerprintExclude, ", ")
	}
	return "covers the whole body"
}

// unscopedRoutes names the routes (and "default" for requests matching no
// route) whose records are not scoped, for the start-up warning.
func unscopedRoutes(base proxy.Settings, file *proxy.File) []string {
	var names []string
	if base.ScopeHeader == "" && base.Key != idem.KeyOff {
		names = append(names, "default")
	}
	if file != nil {
		for _, r := range file.Routes {
			if r.Settings.ScopeHeader == "" && r.Settings.Key != idem.KeyOff {
				names = append(names, r.Pattern)
			}
		}
	}
	return names
}

// selfUpstream reports whether the upstream URL names the proxy's own
// listening address (the same port, on the listener's IP, or on any local
// IP when it listens on all of them): every request would come back to the
// proxy. The upstream's host is resolved with a short bound; when that
// fails the check passes, and the Via field still stops a loop at its
// first request (proxy.CodeLoopDetected).
func selfUpstream(ctx context.Context, upstream *url.URL, addr net.Addr) bool {
	la, ok := addr.(*net.TCPAddr)
	if !ok {
		return false
	}
	port := upstream.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[upstream.Scheme]
	}
	if port != strconv.Itoa(la.Port) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, upstream.Hostname())
	if err != nil {
		return false
	}
	var local []net.IP
	if la.IP.IsUnspecified() {
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok {
					local = append(local, n.IP)
				}
			}
		}
	}
	for _, ip := range ips {
		if ip.IP.Equal(la.IP) || la.IP.IsUnspecified() && (ip.IP.IsLoopback() || ip.IP.IsUnspecified()) {
			return true
		}
		for _, l := range local {
			if ip.IP.Equal(l) {
				return true
			}
		}
	}
	return false
}
