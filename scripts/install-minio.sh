#!/usr/bin/env bash
# Makes the MinIO server that torpor's S3 tests run against available (as
# root): builds it from source with `go install github.com/minio/minio@latest`
# into /var/cache/torpor/bin (or $TORPOR_MINIO_DIR), where
# internal/testenv.MinIO looks for it. Takes ~5 minutes the first time.
#
#   sudo scripts/install-minio.sh                              # idempotent
#   TORPOR_MINIO_DIR=/opt/minio/bin sudo -E scripts/install-minio.sh
#
# Idempotent: does nothing when the binary is there and runs. Downloads
# nothing but Go modules (through the configured Go module proxy).
set -euo pipefail

dir=${TORPOR_MINIO_DIR:-/var/cache/torpor/bin}
bin=$dir/minio
log() { printf 'install-minio: %s\n' "$*" >&2; }
die() { printf 'install-minio: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (sudo $0)"

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
	log "MinIO already installed"
	echo "$bin"
	exit 0
fi

# Any Go that knows toolchain switching (1.21+) will do: it fetches the
# newer toolchain MinIO's go.mod asks for, itself as a Go module.
go_ok() {
	local v
	v=$("$1" env GOVERSION 2>/dev/null) || return 1
	v=${v#go}
	[ "$(printf '%s\n%s\n' 1.21 "$v" | sort -V | head -n1)" = 1.21 ]
}
gobin=
for g in "$(command -v go || true)" /usr/local/lib/torpor-go/current/bin/go /usr/local/go/bin/go; do
	if [ -n "$g" ] && [ -x "$g" ] && go_ok "$g"; then gobin=$g; break; fi
done
[ -n "$gobin" ] || die "no Go 1.21+ on PATH, in /usr/local/lib/torpor-go/current/bin or /usr/local/go/bin (run scripts/install.sh first)"
log "using $("$gobin" version)"

# Build into a private directory and rename, so that an interrupted build
# never leaves a half-written binary where the tests look.
mkdir -p "$dir"
stage=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$stage"' EXIT
log "building MinIO (go install github.com/minio/minio@latest; takes a few minutes)"
GOBIN=$stage GOTOOLCHAIN=${GOTOOLCHAIN:-auto} GOFLAGS= "$gobin" install github.com/minio/minio@latest
"$stage/minio" --version >/dev/null || die "the built MinIO does not run"
mv -f "$stage/minio" "$bin"
log "installed $bin"
echo "$bin"
