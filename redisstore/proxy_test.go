package redisstore_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy is a TCP proxy in front of the real Redis that a test can cut (every
// open connection is closed and new ones are closed on accept) and restore,
// to play a network partition without touching the server.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newProxy listens on a free loopback port and forwards to target until t
// ends.
func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the address clients dial.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection and refuses new ones until Restore.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore lets connections through again.
func (p *proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // the listener was closed
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// track registers c unless the proxy is cut, in which case it closes c.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	_ = c.Close()
}

func (p *proxy) serve(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	// Each direction ends when either side closes; closing both ends the
	// other direction too.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pipe(server, client)
		_ = client.Close()
	}()
	pipe(client, server)
	_ = server.Close()
	wg.Wait()
}

// pipe copies src to dst until either fails; a failure is a closed side,
// which is how every proxied connection ends.
func pipe(dst, src net.Conn) { _, _ = io.Copy(dst, src) }
