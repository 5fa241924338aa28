package blob

import (
	"errors"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

func TestValidateKey(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{"fn/v1/snap-1/pages.img", true},
		{"A.b_c-9/..x/.hidden", true},
		{strings.Repeat("k", MaxKeyLen), true},
		{strings.Repeat("k", MaxKeyLen+1), false},
		{"", false},
		{"..", false},
		{"../x", false},
		{"a/../b", false},
		{"./a", false},
		{"a/.", false},
		{"/abs", false},
		{"a/", false},
		{"a//b", false},
		{"a b", false},
		{"a\\b", false},
		{"é", false},
	} {
		err := ValidateKey(tc.key)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ValidateKey(%.30q) = %v, want ok=%v", tc.key, err, tc.ok)
		}
	}
}

func TestValidatePrefix(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		ok     bool
	}{
		{"", true},
		{"a", true},
		{"a/", true},
		{"a/b", true},
		{"a/.", true},  // starts "a/.hidden"
		{"a/..", true}, // starts "a/..x"
		{"/", false},
		{"/a", false},
		{"../", false},
		{"./", false},
		{"a/../", false},
		{"a//", false},
		{"a b", false},
	} {
		err := ValidatePrefix(tc.prefix)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ValidatePrefix(%q) = %v, want ok=%v", tc.prefix, err, tc.ok)
		}
	}
}

func TestCheckRange(t *testing.T) {
	for _, tc := range []struct {
		off, length, size, want int64
		ok                      bool
	}{
		{0, -1, 10, 10, true},
		{0, 10, 10, 10, true},
		{3, 4, 10, 4, true},
		{10, -1, 10, 0, true},
		{10, 0, 10, 0, true},
		{0, -1, 0, 0, true},
		{11, -1, 10, 0, false},
		{5, 6, 10, 0, false},
		{-1, 1, 10, 0, false},
		{1, -1, 0, 0, false},
	} {
		n, err := CheckRange("k", tc.off, tc.length, tc.size)
		if (err == nil) != tc.ok || n != tc.want || err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("CheckRange(%d, %d, size %d) = %d, %v; want %d, ok=%v", tc.off, tc.length, tc.size, n, err, tc.want, tc.ok)
		}
	}
}
