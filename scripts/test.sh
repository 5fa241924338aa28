#!/usr/bin/env bash
# Runs torpor's whole test suite: unit tests beside the code and end-to-end
# tests that boot the real binary. Installs what is missing first (as root).
# .ci/run calls exactly this.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
scripts/install.sh
export PATH=/usr/local/lib/torpor-go/current/bin:$PATH
# The real MinIO the S3 blob-store tests run against (built once, cached
# outside the repo).
scripts/install-minio.sh >/dev/null

# Test-only Python tools (the OpenAPI validator), in a venv of their own so
# the system's Python stays untouched.
venv=${TORPOR_TEST_VENV:-/var/cache/torpor/test-venv}
if ! "$venv/bin/python" -c 'import openapi_spec_validator, yaml' 2>/dev/null; then
	rm -rf "$venv"
	mkdir -p "$(dirname "$venv")"
	if ! python3 -m venv "$venv" 2>/dev/null; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
		python3 -m venv "$venv"
	fi
	"$venv/bin/python" -m pip install --quiet --disable-pip-version-check openapi-spec-validator pyyaml
fi
export TORPOR_TEST_PYTHON=$venv/bin/python
# Everything the tests need is installed above: a test that would skip for
# want of root, CRIU or MinIO fails instead (internal/testenv), so a broken
# install cannot pass as a green run.
export CI=${CI:-1}
go vet ./...
# -p 1: the end-to-end tests start sandboxes and JetStream servers; on a
# 2-core machine running packages side by side only adds noise and timeouts.
go test -count=1 -p 1 -timeout 30m ./... "$@"
