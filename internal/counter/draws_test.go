package counter

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

func TestCheckDraws(t *testing.T) {
	answer := func(xs []uint64, sum string, incs int) []byte {
		if sum == "" {
			h := sha256.New()
			for _, x := range xs {
				h.Write(binary.BigEndian.AppendUint64(nil, x))
			}
			sum = hex.EncodeToString(h.Sum(nil))
		}
		b, _ := json.Marshal(Draws{Xs: xs, Sum: sum, Incs: incs})
		return b
	}
	xs := []uint64{4, 7, 8, 9} // two divisible by 4
	tests := []struct {
		name    string
		payload []byte
		steps   int
		counted int64
		wantErr string
	}{
		{"one uninterrupted run", answer(xs, "", 2), 4, 2, ""},
		{"an increment done twice", answer(xs, "", 2), 4, 3, "counter saw 3"},
		{"an increment lost", answer(xs, "", 2), 4, 1, "counter saw 1"},
		{"the function counted wrong", answer(xs, "", 3), 4, 3, "function counted 3"},
		{"draws cut short", answer(xs[:3], "", 2), 4, 2, "3 draws, want 4"},
		{"a checksum of other draws", answer(xs, strings.Repeat("0", 64), 2), 4, 2, "does not match"},
		{"not JSON", []byte("oops"), 4, 2, "answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckDraws(tt.payload, tt.steps, tt.counted)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("CheckDraws = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("CheckDraws = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
