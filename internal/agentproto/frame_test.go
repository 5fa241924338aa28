package agentproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// rawFrame builds a frame by hand, lengths as given, so tests can lie.
func rawFrame(hlen, blen uint32, header, body string) []byte {
	var b bytes.Buffer
	var p [8]byte
	binary.BigEndian.PutUint32(p[0:4], hlen)
	binary.BigEndian.PutUint32(p[4:8], blen)
	b.Write(p[:])
	b.WriteString(header)
	b.WriteString(body)
	return b.Bytes()
}

func frameOf(header, body string) []byte {
	return rawFrame(uint32(len(header)), uint32(len(body)), header, body)
}

func TestReadFrame(t *testing.T) {
	tests := []struct {
		name     string
		in       []byte
		wantErr  error  // errors.Is target; nil = success
		wantText string // substring of the error message
		want     *Frame
	}{
		{
			name: "ok with body",
			in:   frameOf(`{"type":"result","id":"c1"}`, `{"x": "\"y\""}`),
			want: &Frame{Header: Header{Type: TypeResult, ID: "c1"}, Body: []byte(`{"x": "\"y\""}`)},
		},
		{
			name: "ok without body, unknown fields ignored",
			in:   frameOf(`{"type":"hello","v":1,"runtime":"python3.11.7","pid":7,"future":[1,2]}`, ""),
			want: &Frame{Header: Header{Type: TypeHello, V: 1, Runtime: "python3.11.7", Pid: 7}},
		},
		{
			name: "ok error frame",
			in:   frameOf(`{"type":"error","id":"c2","error":{"errorMessage":"m","errorType":"ValueError","stackTrace":["a\n"]}}`, ""),
			want: &Frame{Header: Header{Type: TypeError, ID: "c2", Error: &function.Error{ErrorMessage: "m", ErrorType: "ValueError", StackTrace: []string{"a\n"}}}},
		},
		{name: "empty input", in: nil, wantErr: io.EOF},
		{name: "truncated prefix", in: []byte{0, 0, 0}, wantErr: io.ErrUnexpectedEOF, wantText: "prefix"},
		{name: "truncated header", in: rawFrame(20, 0, `{"type":`, ""), wantErr: io.ErrUnexpectedEOF, wantText: "header"},
		{name: "truncated body", in: rawFrame(15, 10, `{"type":"log"}`+" ", "abc"), wantErr: io.ErrUnexpectedEOF, wantText: "body"},
		{name: "oversize header", in: rawFrame(MaxHeaderSize+1, 0, "", ""), wantErr: ErrProtocol, wantText: "header is 1048577 bytes, over the 1048576-byte limit"},
		{name: "oversize body", in: rawFrame(2, MaxBodySize+1, "{}", ""), wantErr: ErrProtocol, wantText: "body is 16777217 bytes, over the 16777216-byte limit"},
		{name: "empty header", in: rawFrame(0, 0, "", ""), wantErr: ErrProtocol, wantText: "header is empty"},
		{name: "bad JSON", in: frameOf(`{"type":"log",`, ""), wantErr: ErrProtocol, wantText: "not a valid JSON object"},
		{name: "JSON not an object", in: frameOf(`[1,2]`, ""), wantErr: ErrProtocol, wantText: "not a valid JSON object"},
		{name: "missing type", in: frameOf(`{"id":"x"}`, ""), wantErr: ErrProtocol, wantText: `no "type"`},
		{name: "wrong field type", in: frameOf(`{"type":"ready","init_ms":"soon"}`, ""), wantErr: ErrProtocol, wantText: "init_ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ReadFrame(bytes.NewReader(tt.in))
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("ReadFrame: %v", err)
				}
				assertFrameEqual(t, f, tt.want)
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ReadFrame error = %v, want errors.Is %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("ReadFrame error %q does not mention %q", err, tt.wantText)
			}
		})
	}
}

func assertFrameEqual(t *testing.T, got, want *Frame) {
	t.Helper()
	gh, wh := got.Header, want.Header
	ge, we := gh.Error, wh.Error
	gh.Error, wh.Error = nil, nil
	if !reflect.DeepEqual(gh, wh) {
		t.Errorf("header = %+v, want %+v", gh, wh)
	}
	if (ge == nil) != (we == nil) || ge != nil && (ge.ErrorType != we.ErrorType || ge.ErrorMessage != we.ErrorMessage || strings.Join(ge.StackTrace, "|") != strings.Join(we.StackTrace, "|")) {
		t.Errorf("error = %+v, want %+v", ge, we)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("body = %q, want %q", got.Body, want.Body)
	}
}

// countingWriter records each Write so tests can check a frame is one write.
type countingWriter struct {
	writes int
	buf    bytes.Buffer
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.buf.Write(p)
}

func TestWriteFrame(t *testing.T) {
	tests := []struct {
		name    string
		frame   Frame
		wantErr error
	}{
		{name: "invoke", frame: Frame{Header: Header{Type: TypeInvoke, ID: "c1", DeadlineMS: 1700000000123, TraceID: "Root=1-<&>"}, Body: []byte(`{"k": "v"}`)}},
		{name: "no body", frame: Frame{Header: Header{Type: TypePing, ID: "p"}}},
		{name: "binary body", frame: Frame{Header: Header{Type: TypeLog, Stream: StreamStderr}, Body: []byte{0, 0xff, '\n', 0x80}}},
		{name: "max body", frame: Frame{Header: Header{Type: TypeResult, ID: "big"}, Body: make([]byte, MaxBodySize)}},
		{name: "oversize body", frame: Frame{Header: Header{Type: TypeResult, ID: "big"}, Body: make([]byte, MaxBodySize+1)}, wantErr: errdefs.ErrTooLarge},
		{name: "oversize header", frame: Frame{Header: Header{Type: TypeInit, Handler: strings.Repeat("h", MaxHeaderSize)}}, wantErr: errdefs.ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w countingWriter
			err := WriteFrame(&w, &tt.frame)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("WriteFrame error = %v, want %v", err, tt.wantErr)
				}
				if w.writes != 0 {
					t.Fatalf("WriteFrame wrote %d times before refusing", w.writes)
				}
				return
			}
			if err != nil {
				t.Fatalf("WriteFrame: %v", err)
			}
			if w.writes != 1 {
				t.Fatalf("WriteFrame made %d writes, want 1", w.writes)
			}
			raw := w.buf.Bytes()
			hlen := binary.BigEndian.Uint32(raw[0:4])
			if bytes.Contains(raw[8:8+hlen], []byte("\n")) {
				t.Errorf("header JSON contains a newline: %q", raw[8:8+hlen])
			}
			got, err := ReadFrame(&w.buf)
			if err != nil {
				t.Fatalf("ReadFrame of WriteFrame output: %v", err)
			}
			assertFrameEqual(t, got, &tt.frame)
		})
	}
}

// TestReadFrameStream reads back-to-back frames through one bufio.Reader,
// the way Client does.
func TestReadFrameStream(t *testing.T) {
	var stream bytes.Buffer
	for i := 0; i < 3; i++ {
		if err := WriteFrame(&stream, &Frame{Header: Header{Type: TypeLog, ID: "c", Stream: StreamStdout}, Body: bytes.Repeat([]byte{'a' + byte(i)}, 100000)}); err != nil {
			t.Fatal(err)
		}
	}
	br := bufio.NewReader(&stream)
	for i := 0; i < 3; i++ {
		f, err := ReadFrame(br)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if len(f.Body) != 100000 || f.Body[0] != 'a'+byte(i) {
			t.Fatalf("frame %d: body of %d bytes starting %q", i, len(f.Body), f.Body[:1])
		}
	}
	if _, err := ReadFrame(br); err != io.EOF {
		t.Fatalf("after last frame: err = %v, want io.EOF", err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(frameOf(`{"type":"result","id":"c1"}`, `{"a": 1}`))
	f.Add(frameOf(`{"type":"log","id":"","stream":"stdout"}`, "hi\n"))
	f.Add(frameOf(`{"type":"error","id":"x","error":{"errorType":"E","errorMessage":"m","stackTrace":["s"]}}`, ""))
	f.Add(frameOf(`{"type":"hello","v":1}`, ""))
	f.Add(rawFrame(5, 1<<24, `{"a":`, ""))
	f.Add([]byte{0, 0, 0, 2, 0, 0, 0, 0, '{', '}'})
	f.Fuzz(func(t *testing.T, in []byte) {
		fr, err := ReadFrame(bytes.NewReader(in))
		if err != nil {
			if fr != nil {
				t.Fatalf("ReadFrame returned a frame with error %v", err)
			}
			if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrProtocol) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		if fr.Header.Type == "" || len(fr.Body) > MaxBodySize {
			t.Fatalf("accepted an invalid frame: %+v", fr.Header)
		}
		// What was read must survive a round trip.
		var buf bytes.Buffer
		if err := WriteFrame(&buf, fr); err != nil {
			t.Fatalf("WriteFrame of a frame ReadFrame accepted: %v", err)
		}
		again, err := ReadFrame(&buf)
		if err != nil {
			t.Fatalf("ReadFrame of re-encoded frame: %v", err)
		}
		assertFrameEqual(t, again, fr)
	})
}
