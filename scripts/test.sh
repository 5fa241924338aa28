#!/usr/bin/env bash
# Runs torpor's whole test suite: unit tests beside the code and end-to-end
# tests that boot the real binary. Installs what is missing first (as root).
# .ci/run calls exactly this.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
scripts/install.sh
export PATH=/usr/local/lib/torpor-go/current/bin:$PATH
go vet ./...
# -p 1: the end-to-end tests start sandboxes and JetStream servers; on a
# 2-core machine running packages side by side only adds noise and timeouts.
go test -count=1 -p 1 -timeout 30m ./... "$@"
