package app

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/config"
	"github.com/torpor-dev/torpor/internal/notice"
)

func TestNoticeGrace(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		deadline time.Time
		want     time.Duration
	}{
		{"no deadline: the configured grace", time.Time{}, 30 * time.Second},
		{"two minutes: less 5 s", now.Add(2 * time.Minute), 115 * time.Second},
		{"30 s: less 5 s", now.Add(30 * time.Second), 25 * time.Second},
		{"12 s: less a sixth", now.Add(12 * time.Second), 10 * time.Second},
		{"already past", now.Add(-time.Second), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := noticeGrace(notice.Notice{Deadline: tt.deadline}, 30*time.Second, now); got != tt.want {
				t.Errorf("noticeGrace = %s, want %s", got, tt.want)
			}
		})
	}
}

// Calls that may outlive the shortest grace a worker can get start on
// instances that can move: with a cloud's notice, that can be less than
// --eviction-grace.
func TestShortestGrace(t *testing.T) {
	now := time.Now()
	tests := []struct {
		notice string
		grace  time.Duration
		want   time.Duration
	}{
		{"", 30 * time.Second, 30 * time.Second},
		{"", 0, 0},
		{"gcp", 30 * time.Second, 25 * time.Second},
		{"azure", 30 * time.Second, 25 * time.Second},
		{"aws", 30 * time.Second, 30 * time.Second},
		{"aws", 5 * time.Minute, 115 * time.Second},
		{"gcp", 10 * time.Second, 10 * time.Second},
	}
	for _, tt := range tests {
		cfg := config.Config{EvictionNotice: tt.notice, EvictionGrace: tt.grace}
		if got := shortestGrace(cfg, now); got != tt.want {
			t.Errorf("notice %q, grace %s: shortest grace %s, want %s", tt.notice, tt.grace, got, tt.want)
		}
	}
}
