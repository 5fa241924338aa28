#!/usr/bin/env bash
# Installs what torpor needs on a Debian/Ubuntu machine (as root), builds the
# torpor binary into /usr/local/bin, and with "up" starts `torpor up`:
#
#   sudo scripts/install.sh            # install + build
#   sudo scripts/install.sh up [ARGS]  # install + build + torpor up ARGS
#
# Idempotent: only what is missing is installed. Never downloads anything but
# Debian packages and Go modules (the Go toolchain itself is a Go module).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${TORPOR_PREFIX:-/usr/local}
log() { printf 'install: %s\n' "$*" >&2; }
die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (sudo $0): torpor's worker creates namespaces and cgroups"
command -v apt-get >/dev/null || die "this script supports Debian/Ubuntu (apt-get not found)"

apt_updated=
apt_install() {
	local missing=()
	for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
	[ ${#missing[@]} -eq 0 ] && return 0
	if [ -z "$apt_updated" ]; then
		log "apt-get update"
		apt-get update -qq
		apt_updated=1
	fi
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Base tools. python3 is the Python runtime's interpreter (any >= 3.8).
apt_install ca-certificates git
command -v python3 >/dev/null || apt_install python3

# Go: the version go.mod asks for. A Go too old (Debian 12 ships 1.19) fetches
# the toolchain as the module golang.org/toolchain through the configured Go
# module proxy, exactly as GOTOOLCHAIN does in newer Go.
want=$(awk '/^go /{print $2; exit}' "$repo/go.mod")
ver_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
go_ok() {
	local g=$1 v
	v=$("$g" env GOVERSION 2>/dev/null || true)
	v=${v#go}
	[ -n "$v" ] && ver_ge "$v" "$want"
}
gobin=
for g in "$(command -v go || true)" /usr/local/go/bin/go "$prefix/lib/torpor-go/current/bin/go"; do
	if [ -n "$g" ] && [ -x "$g" ] && go_ok "$g"; then gobin=$g; break; fi
done
if [ -z "$gobin" ]; then
	command -v go >/dev/null || apt_install golang-go
	arch=$(dpkg --print-architecture)
	tc="v0.0.1-go${want}.linux-${arch}"
	case $want in *.*.*) ;; *) tc="v0.0.1-go${want}.0.linux-${arch}" ;; esac
	gopath="$prefix/lib/torpor-go/path"
	log "fetching Go toolchain golang.org/toolchain@$tc"
	dir=$(cd /tmp && GOPATH=$gopath GOFLAGS=-modcacherw GO111MODULE=on go mod download -json "golang.org/toolchain@$tc" |
		awk -F'"' '/"Dir"/{print $4}')
	[ -n "$dir" ] && [ -d "$dir" ] || die "could not fetch the Go toolchain $tc through the Go module proxy"
	# Module zips carry no file modes.
	chmod -R a+rx "$dir/bin" "$dir/pkg/tool"
	ln -sfn "$dir" "$prefix/lib/torpor-go/current"
	gobin="$prefix/lib/torpor-go/current/bin/go"
	go_ok "$gobin" || die "fetched Go toolchain at $dir does not work"
fi
log "using $("$gobin" version)"

# CRIU >= 4.2 for snapshots: the distribution's when it works here,
# otherwise Debian unstable's in a private prefix (see the script).
"$repo/scripts/install-criu.sh"

log "building torpor"
(cd "$repo" && GOFLAGS=-buildvcs=false "$gobin" build -trimpath -o "$prefix/bin/torpor.new" ./cmd/torpor)
# The sandbox init, beside torpor: the worker re-executes it for every
# instance and snapshot, and it starts much faster than torpor itself.
(cd "$repo" && GOFLAGS=-buildvcs=false "$gobin" build -trimpath -o "$prefix/bin/torpor-init.new" ./cmd/torpor-init)
mv "$prefix/bin/torpor-init.new" "$prefix/bin/torpor-init"
mv "$prefix/bin/torpor.new" "$prefix/bin/torpor"
log "installed $prefix/bin/torpor"

if [ "${1:-}" = up ]; then
	shift
	exec "$prefix/bin/torpor" up "$@"
fi
