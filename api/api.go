// Package api holds torpor's HTTP API contract: the OpenAPI document
// (openapi.yaml, embedded as OpenAPI) and the few JSON wire types of the /v1
// API that are not already defined by package function. The gateway serves
// these shapes and the client consumes them; this package does no I/O and
// must import nothing from torpor but package function.
package api

import (
	_ "embed"

	"github.com/torpor-dev/torpor/internal/function"
)

// OpenAPI is the OpenAPI 3.1 document describing every route the gateway
// serves. Tests check that it stays in step with the gateway's route table.
//
//go:embed openapi.yaml
var OpenAPI []byte

// DeployRequest is the body of PUT /v1/functions/{name}. The spec fields sit
// at the top level (runtime, handler, memory_mb, timeout_s, env,
// concurrency); name is optional and, when set, must equal the path name.
// CodeZip travels as standard base64, which encoding/json does for []byte.
type DeployRequest struct {
	function.Spec
	CodeZip []byte `json:"code_zip"`
}

// Error is the body of every non-2xx /v1 response.
type Error struct {
	// Message says what went wrong and what to do about it.
	Message string `json:"error"`
	// Code is one of the Code* constants; clients branch on it, not on Message.
	Code string `json:"code"`
}

// Error codes of the /v1 API, one per error class (see internal/errdefs),
// plus method_not_allowed for a known path with the wrong method and
// unauthorized for a request without the right API token.
const (
	CodeNotFound         = "not_found"          // 404
	CodeInvalid          = "invalid"            // 400
	CodeConflict         = "conflict"           // 409
	CodeTooLarge         = "too_large"          // 413
	CodeThrottled        = "throttled"          // 429
	CodeUnavailable      = "unavailable"        // 503
	CodeTimeout          = "timeout"            // 504
	CodeInternal         = "internal"           // 500
	CodeMethodNotAllowed = "method_not_allowed" // 405
	CodeUnauthorized     = "unauthorized"       // 401, with WWW-Authenticate: Bearer
)

// FunctionList is the body of GET /v1/functions.
type FunctionList struct {
	Functions []function.Version `json:"functions"`
}

// CallList is the body of GET /v1/functions/{name}/calls.
type CallList struct {
	Calls []function.Call `json:"calls"`
}

// Health is the body of GET /healthz.
type Health struct {
	Status string `json:"status"`
}

// Headers of /v1 invoke responses.
const (
	HeaderCallID        = "X-Torpor-Call-Id"
	HeaderVersion       = "X-Torpor-Version"
	HeaderStart         = "X-Torpor-Start"
	HeaderFunctionError = "X-Torpor-Function-Error"
	// FunctionErrorUnhandled is the value of HeaderFunctionError when the
	// handler raised, timed out or crashed; the body is a function.Error.
	FunctionErrorUnhandled = "Unhandled"
)

// Query limits of GET /v1/functions/{name}/calls.
const (
	DefaultCallsLimit = 20
	MaxCallsLimit     = 1000
)

// SnapshotCreate is the body of POST /v1/snapshots: snapshot an idle
// instance of a function (any idle one, the one named, or a new one).
type SnapshotCreate struct {
	Function string `json:"function,omitempty"` // required unless Call is set
	Version  int    `json:"version,omitempty"`  // 0 = latest
	Instance string `json:"instance,omitempty"` // an idle instance's id (i-…)
	// Call names a call: the instance that served it is snapshotted, on
	// the worker that ran it, once the call is over (a running call cannot
	// be checkpointed yet: 409).
	Call string `json:"call,omitempty"`
	// Worker routes the request to one worker (the one holding Instance);
	// empty lets any worker take it.
	Worker string `json:"worker,omitempty"`
	// LeaveRunning keeps the instance serving after the dump.
	LeaveRunning bool `json:"leave_running,omitempty"`
	// NoGC skips the runtime's GC and allocator trim before the dump.
	NoGC bool `json:"no_gc,omitempty"`
	// Use makes it the snapshot new instances of the version start from.
	Use bool `json:"use,omitempty"`
}

// SnapshotCreated answers POST /v1/snapshots. Durations are nanoseconds.
type SnapshotCreated struct {
	ID          string `json:"id"`
	Function    string `json:"function"`
	Version     int    `json:"version"`
	Instance    string `json:"instance"`
	Worker      string `json:"worker"`
	RSSBefore   int64  `json:"rss_before"` // bytes, before the runtime's GC
	RSSAfter    int64  `json:"rss_after"`  // after it
	GCNanos     int64  `json:"gc_ns"`
	DumpNanos   int64  `json:"dump_ns"`
	WallNanos   int64  `json:"wall_ns"`
	RawBytes    int64  `json:"raw_bytes"`
	StoredBytes int64  `json:"stored_bytes"`
	Used        bool   `json:"used"`
}

// Snapshot describes a stored snapshot (GET /v1/snapshots[/{id}]).
type Snapshot struct {
	ID              string         `json:"id"`
	Function        string         `json:"function"`
	FunctionVersion int            `json:"function_version"`
	Runtime         string         `json:"runtime"`
	CRIUVersion     string         `json:"criu_version"`
	Kernel          string         `json:"kernel"`
	Arch            string         `json:"arch"`
	CreatedAt       string         `json:"created_at"`
	Compression     string         `json:"compression"`
	StoredBytes     int64          `json:"stored_bytes"`
	RawBytes        int64          `json:"raw_bytes"`
	MemoryBytes     int64          `json:"memory_bytes,omitempty"`
	KeyID           string         `json:"key_id"`
	Files           []SnapshotFile `json:"files,omitempty"` // GET /v1/snapshots/{id} only
	// InUse lists the function versions that start from it.
	InUse []string `json:"in_use,omitempty"`
	// Error says why a stored manifest cannot be used (corrupt).
	Error string `json:"error,omitempty"`
}

// SnapshotFile is one image file of a snapshot.
type SnapshotFile struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// SnapshotList is the body of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// SnapshotGC answers POST /v1/snapshots/gc: the blob keys of the removed
// data objects (left by uploads that died before their manifest).
type SnapshotGC struct {
	Removed []string `json:"removed"`
}

// WorkerList is the reply of GET /v1/workers: every worker that reported
// in the last few seconds, with what it keeps warm.
type WorkerList struct {
	Workers []WorkerSummary `json:"workers"`
}

// WorkerSummary is what a worker publishes about itself every second (and
// whenever what it holds changes); the gateway places calls with it.
type WorkerSummary struct {
	ID             string `json:"id"`
	UpdatedAt      string `json:"updated_at"` // RFC 3339
	MemoryBudgetMB int    `json:"memory_budget_mb"`
	ReservedMB     int    `json:"reserved_mb"` // memory limits of live instances
	Running        int    `json:"running"`     // calls in flight
	// Draining: the worker is being evicted or shut down. It takes no new
	// calls and moves or finishes its running ones; its entry goes once
	// they are over.
	Draining bool      `json:"draining,omitempty"`
	Holdings []Holding `json:"holdings,omitempty"`
}

// Holding is what one worker keeps of one function version: idle (hot)
// instances and a function template to fork new ones from.
type Holding struct {
	Function string `json:"function"`
	Version  int    `json:"version"`
	Idle     int    `json:"idle"`
	Template bool   `json:"template"`
}

// WorkerInfo is the reply of GET /v1/workers/{id}: the worker's summary
// and the memory of each process it keeps, measured from /proc (smaps).
type WorkerInfo struct {
	WorkerSummary
	// Host memory as the reclaimer sees it, and its watermarks.
	MemAvailableMB  int           `json:"mem_available_mb"`
	LowWatermarkMB  int           `json:"low_watermark_mb"`  // reclaim when available memory falls below
	HighWatermarkMB int           `json:"high_watermark_mb"` // ... until it is back above
	Templates       []ProcessInfo `json:"templates"`         // runtime and function templates
	Instances       []ProcessInfo `json:"instances"`         // live instances, idle and busy
}

// ProcessInfo is one template or instance process and its memory.
type ProcessInfo struct {
	Kind     string `json:"kind"` // runtime-template | function-template | instance
	Function string `json:"function,omitempty"`
	Version  int    `json:"version,omitempty"`
	Runtime  string `json:"runtime,omitempty"`
	ID       string `json:"id"`
	Pid      int    `json:"pid"`             // host pid
	State    string `json:"state,omitempty"` // instances: idle | busy
	Start    string `json:"start,omitempty"` // instances: how it started (warm, cold, restore)
	// From /proc/PID/smaps_rollup, in bytes: resident, proportional
	// (shared pages divided among their users) and unique (private) set.
	RSS      int64  `json:"rss"`
	PSS      int64  `json:"pss"`
	USS      int64  `json:"uss"`
	LastUsed string `json:"last_used,omitempty"`
}

// DropResult is the reply of DELETE /v1/functions/{name}/instances: what
// the workers stopped of the function.
type DropResult struct {
	Instances int `json:"instances"` // idle instances stopped
	Templates int `json:"templates"` // function templates stopped (0 with keep_templates)
	Workers   int `json:"workers"`   // workers that answered
}

// EvictRequest is the body of POST /v1/workers/{id}/evict: the worker
// stops taking calls, moves its running calls to other workers within
// the grace period, and exits.
type EvictRequest struct {
	GraceMS int64  `json:"grace_ms,omitempty"` // 0: the worker's --eviction-grace
	Reason  string `json:"reason,omitempty"`   // shown in the worker's log
}

// EvictReport is what an eviction did (the reply of the evict route
// describes its start: Running calls, the grace period).
type EvictReport struct {
	Worker    string `json:"worker"`
	Reason    string `json:"reason"`
	GraceMS   int64  `json:"grace_ms"`
	Running   int    `json:"running"`              // calls running when it began
	Moving    int    `json:"moving,omitempty"`     // calls asked to move at once
	LetFinish int    `json:"let_finish,omitempty"` // calls predicted to finish within the grace (or that cannot move)
	Moved     int    `json:"moved,omitempty"`      // calls that left as checkpoints
	TookMS    int64  `json:"took_ms,omitempty"`
}
