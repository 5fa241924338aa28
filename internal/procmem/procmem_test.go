package procmem

import (
	"os"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const rollup = `55a4c2a3b000-7ffd5a9f3000 ---p 00000000 00:00 0                          [rollup]
Rss:                9876 kB
Pss:                4321 kB
Pss_Anon:           2000 kB
Shared_Clean:       5000 kB
Private_Clean:       100 kB
Private_Dirty:      2048 kB
Swap:                  0 kB
`
	for _, tc := range []struct {
		name string
		in   string
		want Mem
		err  string
	}{
		{"full", rollup, Mem{RSS: 9876 << 10, PSS: 4321 << 10, USS: 2148 << 10}, ""},
		{"missing line", "Rss: 1 kB\n", Mem{}, "no Pss line"},
		{"bad number", "Rss: x kB\n", Mem{}, "Rss"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Parse = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestReadSelf(t *testing.T) {
	m, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS <= 0 || m.PSS <= 0 || m.USS <= 0 || m.USS > m.RSS {
		t.Errorf("own memory %+v", m)
	}
}
