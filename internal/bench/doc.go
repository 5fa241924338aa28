// Package bench owns torpor's benchmark commands (`torpor bench ...`): it
// drives a running torpor over HTTP, exactly as a user would, measures a
// baseline with the same client in the same run, and writes the raw
// results (JSON, CSV) and a plot so that every performance claim can be
// reproduced and checked (CONVENTIONS rule 11).
//
// It speaks to torpor only through its public HTTP API (api/openapi.yaml,
// via internal/client for deploys) and must not import any server-side
// package: a benchmark that reached into the gateway or the worker would
// measure something users never see.
package bench
