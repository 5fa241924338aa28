package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/bus"
	"github.com/torpor-dev/torpor/internal/function"
)

// What one call may log, in bytes and in lines; the rest is dropped with a
// note. The line cap matters for floods of short lines, each of which costs
// a log record.
const (
	maxCallLog      = 256 << 10
	maxCallLogLines = 10000
)

// callLog collects one call's output as Lambda-style log lines, framed by
// START / END / REPORT platform lines.
type callLog struct {
	ver       function.Version
	callID    string
	lines     []function.LogLine
	partial   map[string][]byte // unterminated line per stream
	size      int
	truncated bool
}

func newCallLog(ver function.Version, callID string) *callLog {
	l := &callLog{ver: ver, callID: callID, partial: map[string][]byte{}}
	l.platform(fmt.Sprintf("START RequestId: %s Version: %d", callID, ver.Version))
	return l
}

func (l *callLog) platform(text string) {
	l.lines = append(l.lines, function.LogLine{Time: time.Now().UTC(), Function: l.ver.Name, Version: l.ver.Version,
		CallID: l.callID, Stream: "platform", Text: text})
}

// add takes a chunk of output from the agent.
func (l *callLog) add(r agentproto.LogRecord) {
	if l.truncated {
		return
	}
	data := r.Data
	if l.size+len(data) > maxCallLog {
		data = data[:maxCallLog-l.size]
		l.truncated = true
	}
	l.size += len(data)
	buf := append(l.partial[r.Stream], data...)
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		l.user(r.Stream, string(buf[:i]))
		buf = buf[i+1:]
	}
	l.partial[r.Stream] = buf
}

func (l *callLog) user(stream, text string) {
	if len(l.lines) >= maxCallLogLines {
		l.truncated = true
		return
	}
	l.lines = append(l.lines, function.LogLine{Time: time.Now().UTC(), Function: l.ver.Name, Version: l.ver.Version,
		CallID: l.callID, Stream: stream, Text: text})
}

// finish closes the log with the call's outcome.
func (l *callLog) finish(res function.InvokeResult, peakMem uint64) {
	for _, stream := range []string{agentproto.StreamStdout, agentproto.StreamStderr} {
		if rest := l.partial[stream]; len(rest) > 0 {
			l.user(stream, string(rest))
		}
	}
	if l.truncated {
		l.platform(fmt.Sprintf("torpor: output beyond %d KB or %d lines of this call was dropped", maxCallLog>>10, maxCallLogLines))
	}
	if res.Err != nil {
		b, _ := json.Marshal(res.Err)
		l.platform(string(b))
	}
	l.platform("END RequestId: " + l.callID)
	report := fmt.Sprintf("REPORT RequestId: %s Duration: %.2f ms Memory Size: %d MB Start: %s (%.2f ms)",
		l.callID, float64(res.Duration.Microseconds())/1000, l.ver.MemoryMB, res.Start, float64(res.StartTime.Microseconds())/1000)
	if peakMem > 0 {
		report += fmt.Sprintf(" Max Memory Used: %d MB", peakMem>>20)
	}
	l.platform(report)
}

// tail returns the last n bytes of the call's log, as text lines.
func (l *callLog) tail(n int) []byte {
	var sb strings.Builder
	for _, line := range l.lines {
		sb.WriteString(line.Text)
		sb.WriteByte('\n')
	}
	s := sb.String()
	if len(s) > n {
		s = s[len(s)-n:]
		for len(s) > 0 && !utf8.RuneStart(s[0]) { // don't start mid-character
			s = s[1:]
		}
	}
	return []byte(s)
}

// maxLogBatch bounds one log message, well under NATS's max_payload: JSON
// framing can make many short lines far bigger than their text.
const maxLogBatch = 512 << 10

// publishLogs sends the call's lines, in as few messages as fit, without
// waiting for the acks.
func (w *Worker) publishLogs(l *callLog) {
	for _, b := range encodeBatches(l.lines, maxLogBatch) {
		if _, err := w.bus.JS.PublishAsync(bus.SubjLogs+l.ver.Name, b); err != nil {
			w.log.Warn("publish logs", "fn", l.ver.Name, "call", l.callID, "err", err)
			return
		}
	}
}

// encodeBatches encodes lines as JSON arrays of at most limit bytes each,
// in order (a single line longer than limit goes alone).
func encodeBatches(lines []function.LogLine, limit int) [][]byte {
	if len(lines) == 0 {
		return nil
	}
	b, err := json.Marshal(lines)
	if err != nil {
		return nil
	}
	if len(b) <= limit || len(lines) == 1 {
		return [][]byte{b}
	}
	half := len(lines) / 2
	return append(encodeBatches(lines[:half], limit), encodeBatches(lines[half:], limit)...)
}
