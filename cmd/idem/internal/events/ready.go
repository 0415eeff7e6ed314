package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/idemhq/idem/idemamqp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Ping checks that the broker answers, for readiness (/readyz) and the
// start-up log: on NATS, the connection is up, a PING gets its PONG and
// JetStream answers an account-info request; on RabbitMQ, a connection of
// its own (kept open between calls, dialled again when lost) opens and
// closes a channel. It returns by ctx's deadline, which it needs (NATS
// refuses a flush without one). While the NATS client is reconnecting it
// fails at once, with the last connection error the client saw. Calls
// must not overlap (the readiness handler runs one at a time).
func (c *Conn) Ping(ctx context.Context) error {
	if c == nil || c.ping == nil {
		return errors.New("events: no broker connection")
	}
	return c.ping(ctx)
}

// WaitReady waits until Ping succeeds or ctx ends, and returns the last
// Ping error then (nil once the broker answered). Start-up calls it with a
// short bound to log a broker that cannot be reached, with the connection
// error, while the service starts anyway.
func (c *Conn) WaitReady(ctx context.Context) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}

// lastError keeps the newest connection error a client reported.
type lastError struct {
	mu  sync.Mutex
	err error
}

func (l *lastError) set(err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	l.err = err
	l.mu.Unlock()
}

func (l *lastError) get() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// natsPing is Conn.Ping on NATS JetStream.
func natsPing(nc *nats.Conn, js jetstream.JetStream, last *lastError) func(context.Context) error {
	return func(ctx context.Context) error {
		if st := nc.Status(); st != nats.CONNECTED {
			state := strings.ToLower(st.String())
			if err := last.get(); err != nil {
				return fmt.Errorf("not connected (%s); last connection attempt: %w", state, err)
			}
			return fmt.Errorf("not connected (%s)", state)
		}
		if err := nc.FlushWithContext(ctx); err != nil {
			return fmt.Errorf("no answer to a ping: %w", err)
		}
		if _, err := js.AccountInfo(ctx); err != nil {
			return fmt.Errorf("JetStream: %w", err)
		}
		return nil
	}
}

// amqpProbe is Conn.Ping on RabbitMQ. The publisher and the consumer keep
// their connections to themselves, so the probe has its own: one
// connection, dialled on first use and again after it is lost, never more
// than one at a time.
type amqpProbe struct {
	dial idemamqp.DialFunc

	mu     sync.Mutex
	conn   *amqp.Connection
	closed bool
}

func (p *amqpProbe) ping(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("closed")
	}
	conn := p.conn
	p.mu.Unlock()
	if conn == nil || conn.IsClosed() {
		// The dial function bounds connecting, handshake included, by
		// ctx's deadline.
		var err error
		if conn, err = p.dial(ctx); err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = conn.Close()
			return errors.New("closed")
		}
		p.conn = conn
		p.mu.Unlock()
	}
	// Opening a channel is a round trip without a deadline of its own: a
	// broker that stopped answering would hold it until the heartbeats
	// time out (30 s). At ctx's end the connection is closed (at once,
	// without waiting for the broker), which ends the call; the next
	// ping dials again.
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now()) })
	ch, err := conn.Channel()
	stop()
	if err == nil {
		err = ch.Close()
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		_ = conn.CloseDeadline(time.Now())
		return fmt.Errorf("open a channel: %w", err)
	}
	return nil
}

// close closes the probe's connection; later pings fail.
func (p *amqpProbe) close() {
	p.mu.Lock()
	conn := p.conn
	p.conn, p.closed = nil, true
	p.mu.Unlock()
	if conn != nil {
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
	}
}
