package counter

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// DrawsCode is the exactly-once proof's function (app.py, handler
// app.handler; DrawsEvent builds its event): it draws random 64-bit numbers
// (non-deterministic work), hashes them, and at the steps whose number is
// divisible by 4 (points chosen at random) increments the counter over
// HTTP. Its answer (Draws) lets the caller recompute what an uninterrupted
// run of the same draws gives: the hash and the increments.
const DrawsCode = `import hashlib, random, time, urllib.request
def handler(event, context):
    h = hashlib.sha256()
    xs, incs = [], 0
    for i in range(event["steps"]):
        x = random.getrandbits(64)
        xs.append(x)
        h.update(x.to_bytes(8, "big"))
        time.sleep(event["ms"] / 1000)
        if x % 4 == 0:
            req = urllib.request.Request(event["counter"] + "/inc?key=" + event["key"], method="POST")
            urllib.request.urlopen(req, timeout=10).read()
            incs += 1
    return {"xs": xs, "sum": h.hexdigest(), "incs": incs}
`

// DrawsEvent is DrawsCode's event: steps draws, ms apart, counted under
// key on the counter at url.
func DrawsEvent(url, key string, steps, ms int) []byte {
	b, _ := json.Marshal(map[string]any{"steps": steps, "ms": ms, "counter": url, "key": key})
	return b
}

// Draws is DrawsCode's answer.
type Draws struct {
	Xs   []uint64 `json:"xs"`
	Sum  string   `json:"sum"`
	Incs int      `json:"incs"`
}

// CheckDraws parses DrawsCode's answer and compares it, and counted (the
// counter's count for its key), with what one uninterrupted run of the
// same draws gives: steps draws, their hash, and one increment per draw
// divisible by 4. A call run twice, or cut short, fails it.
func CheckDraws(payload []byte, steps int, counted int64) error {
	var d Draws
	if err := json.Unmarshal(payload, &d); err != nil {
		return fmt.Errorf("answer %.200q: %w", payload, err)
	}
	h := sha256.New()
	want := 0
	for _, x := range d.Xs {
		h.Write(binary.BigEndian.AppendUint64(nil, x))
		if x%4 == 0 {
			want++
		}
	}
	switch {
	case len(d.Xs) != steps:
		return fmt.Errorf("%d draws, want %d", len(d.Xs), steps)
	case hex.EncodeToString(h.Sum(nil)) != d.Sum:
		return fmt.Errorf("checksum %s does not match the draws", d.Sum)
	case d.Incs != want:
		return fmt.Errorf("the function counted %d increments, its draws call for %d", d.Incs, want)
	case counted != int64(want):
		return fmt.Errorf("the counter saw %d increments, the draws call for %d", counted, want)
	}
	return nil
}
