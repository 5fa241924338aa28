// Package bench owns torpor's benchmark commands (`torpor bench ...`): it
// drives a running torpor over HTTP, exactly as a user would, measures a
// baseline with the same client in the same run, and writes the raw
// results (JSON, CSV) and a plot so that every performance claim can be
// reproduced and checked (CONVENTIONS rule 11).
//
// It speaks to torpor only through its public HTTP API (api/openapi.yaml,
// via internal/client for deploys). Like the CLI it may use the shared
// client-side helpers (config for the interpreter and the API token,
// codezip to pack code), but never the gateway, dispatcher or worker: a
// benchmark that reached into them would measure something users never see.
package bench
