package counter

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func start(t *testing.T) *Server {
	t.Helper()
	s, err := Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// do sends one request and returns its status, body and response.
func do(t *testing.T, method, u string) (int, string, *http.Response) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, u, err)
	}
	return resp.StatusCode, string(b), resp
}

func TestRequests(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLen+1)
	max := strings.Repeat("k", MaxKeyLen)
	type step struct {
		method, path string
		status       int
		body         string // exact body on success; a substring of it on failure
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"inc by default 1", []step{
			{"POST", "/inc?key=a", 200, "1"},
			{"POST", "/inc?key=a", 200, "2"},
			{"GET", "/value?key=a", 200, "2"},
		}},
		{"inc by N", []step{
			{"POST", "/inc?key=a&by=5", 200, "5"},
			{"POST", "/inc?key=a&by=0", 200, "5"},
			{"POST", "/inc?key=b&by=3", 200, "3"},
			{"GET", "/keys", 200, `{"a":5,"b":3}` + "\n"},
		}},
		{"unknown key is 0", []step{{"GET", "/value?key=nope", 200, "0"}}},
		{"empty keys", []step{{"GET", "/keys", 200, "{}\n"}}},
		{"escaped key", []step{
			{"POST", "/inc?key=" + url.QueryEscape("a b/é&c"), 200, "1"},
			{"GET", "/value?key=" + url.QueryEscape("a b/é&c"), 200, "1"},
		}},
		{"longest key", []step{{"POST", "/inc?key=" + max, 200, "1"}}},
		{"missing key", []step{
			{"POST", "/inc", 400, "missing key"},
			{"POST", "/inc?key=", 400, "missing key"},
			{"GET", "/value", 400, "missing key"},
		}},
		{"key too long", []step{
			{"POST", "/inc?key=" + long, 400, "limit is 200"},
			{"GET", "/value?key=" + long, 400, "limit is 200"},
		}},
		{"bad by", []step{
			{"POST", "/inc?key=a&by=x", 400, "non-negative integer"},
			{"POST", "/inc?key=a&by=1.5", 400, "non-negative integer"},
			{"POST", "/inc?key=a&by=-1", 400, "non-negative integer"},
			{"POST", "/inc?key=a&by=", 400, "non-negative integer"},
			{"POST", "/inc?key=a&by=99999999999999999999", 400, "non-negative integer"},
			{"GET", "/value?key=a", 200, "0"},
		}},
		{"wrong method", []step{
			{"GET", "/inc?key=a", 405, "use POST"},
			{"PUT", "/inc?key=a", 405, "use POST"},
			{"POST", "/value?key=a", 405, "use GET"},
			{"DELETE", "/keys", 405, "use GET"},
			{"GET", "/value?key=a", 200, "0"},
		}},
		{"unknown path", []step{{"GET", "/nope", 404, ""}}},
	}
	s := start(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.Reset()
			for _, st := range tt.steps {
				status, body, resp := do(t, st.method, s.URL()+st.path)
				if status != st.status {
					t.Fatalf("%s %s = %d %q, want %d", st.method, st.path, status, body, st.status)
				}
				if st.status == 200 && body != st.body || st.status != 200 && !strings.Contains(body, st.body) {
					t.Errorf("%s %s body = %q, want %q", st.method, st.path, body, st.body)
				}
				// net/http takes "Connection: close" out of the header
				// into Close; TestConnectionClose reads the raw bytes.
				if !resp.Close {
					t.Errorf("%s %s: response does not close the connection", st.method, st.path)
				}
			}
		})
	}
}

func TestGoAPI(t *testing.T) {
	s := start(t)
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") {
		t.Errorf("URL() = %q, want http://127.0.0.1:PORT", s.URL())
	}
	do(t, "POST", s.URL()+"/inc?key=x&by=4")
	do(t, "POST", s.URL()+"/inc?key=y")
	if v := s.Value("x"); v != 4 {
		t.Errorf("Value(x) = %d, want 4", v)
	}
	if v := s.Value("z"); v != 0 {
		t.Errorf("Value(z) = %d, want 0", v)
	}
	vals := s.Values()
	if len(vals) != 2 || vals["x"] != 4 || vals["y"] != 1 {
		t.Errorf("Values() = %v, want map[x:4 y:1]", vals)
	}
	vals["x"] = 100 // a copy: the server's count stays
	if v := s.Value("x"); v != 4 {
		t.Errorf("Value(x) after changing Values()'s map = %d, want 4", v)
	}
	s.Reset()
	if vals := s.Values(); len(vals) != 0 {
		t.Errorf("Values() after Reset = %v, want empty", vals)
	}
}

// TestConcurrent checks that increments from many clients at once are
// neither lost nor doubled, and that each sees a distinct new value.
func TestConcurrent(t *testing.T) {
	s := start(t)
	const clients, each = 16, 50
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[int64]bool{}
	)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				resp, err := http.Post(s.URL()+"/inc?key=shared", "", nil)
				if err != nil {
					t.Errorf("POST /inc: %v", err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				n, err := strconv.ParseInt(string(b), 10, 64)
				if resp.StatusCode != 200 || err != nil {
					t.Errorf("POST /inc = %d %q", resp.StatusCode, b)
					return
				}
				mu.Lock()
				if seen[n] {
					t.Errorf("value %d answered twice", n)
				}
				seen[n] = true
				mu.Unlock()
				if resp, err := http.Post(s.URL()+"/inc?key=c"+strconv.Itoa(c)+"&by=2", "", nil); err == nil {
					resp.Body.Close()
				} else {
					t.Errorf("POST /inc: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if v := s.Value("shared"); v != clients*each {
		t.Errorf("Value(shared) = %d, want %d", v, clients*each)
	}
	_, body, _ := do(t, "GET", s.URL()+"/keys")
	var all map[string]int64
	if err := json.Unmarshal([]byte(body), &all); err != nil {
		t.Fatalf("GET /keys: %v: %q", err, body)
	}
	if len(all) != clients+1 {
		t.Errorf("GET /keys has %d keys, want %d", len(all), clients+1)
	}
	for c := range clients {
		if v := all["c"+strconv.Itoa(c)]; v != 2*each {
			t.Errorf("c%d = %d, want %d", c, v, 2*each)
		}
	}
}

// TestConnectionClose checks on the wire that the server says
// "Connection: close" and closes the connection, even when the client
// asks to keep it alive: a function must hold no socket between
// increments.
func TestConnectionClose(t *testing.T) {
	s := start(t)
	for _, tt := range []struct {
		req    string
		header bool // HTTP/1.0 closes by default, so net/http sends no header
	}{
		{"POST /inc?key=a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n", true},
		{"GET /value?key=a HTTP/1.1\r\nHost: x\r\n\r\n", true},
		{"GET /value HTTP/1.1\r\nHost: x\r\n\r\n", true},
		{"GET /keys HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", false},
	} {
		req := tt.req
		c, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		// ReadAll ends only when the server closes the connection.
		raw, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Fatalf("%q: read until the server closes: %v (got %q)", req, err, raw)
		}
		if tt.header && !strings.Contains(string(raw), "\r\nConnection: close\r\n") {
			t.Errorf("%q: response has no \"Connection: close\": %q", req, raw)
		}
	}
}

func TestStartBadAddr(t *testing.T) {
	if _, err := Start("not an address"); err == nil {
		t.Fatal("Start(bad address) succeeded")
	}
}

func TestCloseStopsServing(t *testing.T) {
	s, err := Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if resp, err := http.Post(s.URL()+"/inc?key=a", "", nil); err == nil {
		resp.Body.Close()
		t.Fatal("POST after Close succeeded")
	}
}
