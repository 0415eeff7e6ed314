package proxy

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"slices"
	"testing"
)

// FuzzDroppedConnection puts arbitrary bytes (earlier responses, bodies,
// garbage) before a response's header on a connection: the search never
// panics and always finds that header, the last one, with its own
// Connection values, however much came before it.
func FuzzDroppedConnection(f *testing.F) {
	for _, s := range []string{"", "HTTP/1.1 201 Created\r\nConnection: close, X-Decoy\r\n\r\n",
		"HTTP/1.1 201 Created\r\n", "\r\n\r\n", "garbage"} {
		f.Add([]byte(s))
	}
	const header = "HTTP/1.1 201 Created\r\nConnection: close, X-Secret\r\nX-Secret: s\r\nContent-Length: 0\r\n\r\n"
	f.Fuzz(func(t *testing.T, before []byte) {
		stream := append(slices.Clip(before), header...)
		res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader([]byte(header))), nil)
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		go func() {
			a.Write(stream)
			a.Close()
		}()
		c := &captureConn{Conn: b}
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				break
			}
		}
		conn, found := droppedConnection(res, c)
		if !found || !slices.Equal(conn, []string{"close, X-Secret"}) {
			t.Fatalf("after %d bytes: found %v, Connection %q", len(before), found, conn)
		}
	})
}
