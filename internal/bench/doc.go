// Package bench owns torpor's benchmark commands (`torpor bench ...`). Each
// measures a baseline in the same run and writes the raw results (JSON,
// CSV) and a plot, so that every performance claim can be reproduced and
// checked (CONVENTIONS rule 11).
//
// Two kinds live here. Platform benchmarks (warm, and the fast-start ones:
// starts, density, diversity, bursts) drive a running torpor over its
// public HTTP API (api/openapi.yaml, via internal/client for deploys),
// exactly as a user would: to force a warm or cold start they drop
// instances and templates (DELETE /v1/functions/{name}/instances), and they
// read memory from GET /v1/workers/{id}. Like the CLI they may use the
// shared client-side helpers (config, codezip) but never the gateway,
// dispatcher or worker: a benchmark that reached into them would measure
// something users never see. Engine benchmarks (snapshot) measure one
// mechanism in isolation, in-process, with the same packages the worker
// uses (sandbox, snapshot, blob) — the stages of a checkpoint cannot be
// timed from outside — and need root and CRIU like a worker.
package bench
