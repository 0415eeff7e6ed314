package proxy

import "testing"

// FuzzFramingMatchesNetHTTP checks the framer against net/http's own
// request parser on arbitrary byte streams: every request net/http reads
// from what the framer lets through ends where the framer says a request
// ends, so that no byte the framer took for a body is ever read as a
// request, and the framer passes the client's bytes unchanged (a refused
// header is replaced by its stand-in, after which nothing passes).
func FuzzFramingMatchesNetHTTP(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nX: y\r\n\r\nGET /2 HTTP/1.1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\n\r\n",
		"POST / HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\n\r\n",
		"POST / HTTP/1.1\nHost: x\nContent-Length: 2\n\nokGET /2 HTTP/1.1\n\n",
		"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
	} {
		f.Add([]byte(seed), uint8(3))
	}
	f.Fuzz(func(t *testing.T, stream []byte, step uint8) {
		if len(stream) == 0 || len(stream) > 64<<10 {
			return
		}
		checkAgainstNetHTTP(t, stream, int(step%64)+1)
	})
}
