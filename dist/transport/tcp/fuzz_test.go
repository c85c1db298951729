package tcp

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// FuzzServerHandshake feeds arbitrary bytes to the accepting side of the
// handshake and checks that it never panics and that a connector without
// the token gets nothing but a nonce and a refusal: at most one Challenge
// of exactly a nonce's size, then at most a Reject, and never a Welcome.
func FuzzServerHandshake(f *testing.F) {
	hello := make([]byte, wire.HelloSize)
	(&wire.HelloInfo{World: 3, Peer: 0, QueueLimit: 1, MaxFrame: 1 << 20}).Put(hello)
	good := header(wire.Header{Kind: wire.Hello, Src: 2, Len: wire.HelloSize})
	good = append(good, hello...)
	auth := append(header(wire.Header{Kind: wire.Auth, Src: 2, Len: wire.AuthSize}), make([]byte, wire.AuthSize)...)
	f.Add(good)
	f.Add(append(append([]byte(nil), good...), auth...))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add(header(wire.Header{Kind: wire.Data, Src: 2, Len: 1 << 40}))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	cfg := defaultConfig()
	cfg.token = testToken
	cfg.hsTimeout = time.Second
	srv := &Transport{rank: 0, world: 3, cfg: cfg, claimed: make([]bool, 3), joinedFrom: make([]string, 3),
		accept: func(r int) bool { return r > 0 }, acceptMode: wire.ModeMesh}
	srv.ctx = context.Background()

	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		sc := s.(*net.TCPConn)
		defer sc.Close()
		go func() {
			c.Write(in)
			c.(*net.TCPConn).CloseWrite()
		}()
		if _, _, err := srv.serverHandshake(sc, newFrameReader(sc, readBuf)); err == nil {
			t.Fatalf("handshake accepted %x", in)
		}
		sc.CloseWrite()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		out, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		for seen := 0; len(out) > 0; seen++ {
			h, err := wire.Parse(out, wire.ChallengeSize)
			if err != nil {
				t.Fatalf("the server wrote a bad frame: %v", err)
			}
			switch {
			case seen == 0 && h.Kind == wire.Challenge && h.Len == wire.ChallengeSize:
			case h.Kind == wire.Reject && h.Stamp == 0:
			default:
				t.Fatalf("frame %d from the server: %v of %d bytes (stamp %d)", seen, h.Kind, h.Len, h.Stamp)
			}
			out = out[wire.HeaderSize+int(h.Len):]
		}
	})
}
