#!/usr/bin/env bash
# Makes a CRIU >= 4.2 that works on this kernel available to torpor (as root).
#
# Prefers the distribution's criu when it passes `criu check` and can dump a
# process holding an inet socket. Otherwise (Debian 12's 3.17 fails on new
# kernels' vDSO; Debian 13's 4.1 cannot dump inet sockets on kernels that
# refuse SO_PASSCRED on them) it downloads Debian unstable's criu and the
# libraries it needs with apt-get download, using a sources list, package
# lists and cache of its own so that the system's apt state is untouched,
# and unpacks them with dpkg -x into a private prefix (default
# /usr/local/lib/torpor-criu). torpor runs that criu through the prefix's
# own dynamic loader; nothing in the system changes.
#
#   sudo scripts/install-criu.sh          # idempotent
#   TORPOR_CRIU_PREFIX=/opt/criu sudo -E scripts/install-criu.sh
set -euo pipefail

prefix=${TORPOR_CRIU_PREFIX:-/usr/local/lib/torpor-criu}
mirror=${TORPOR_CRIU_MIRROR:-http://deb.debian.org/debian}
suite=${TORPOR_CRIU_SUITE:-unstable}
min=4.2
log() { printf 'install-criu: %s\n' "$*" >&2; }
die() { printf 'install-criu: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root"
arch=$(dpkg --print-architecture)
[ "$arch" = amd64 ] || die "only amd64 is supported (found $arch)"
libdir=$prefix/usr/lib/x86_64-linux-gnu
private=("$libdir/ld-linux-x86-64.so.2" --library-path "$libdir" "$prefix/usr/sbin/criu")

ver_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
criu_version() { "$@" --version 2>/dev/null | awk '/^Version:/{print $2}'; }

# checks CRIU...: version >= min and `criu check` passes.
checks() {
	local v
	v=$(criu_version "$@") || return 1
	[ -n "$v" ] && ver_ge "$v" "$min" || return 1
	"$@" check >/dev/null 2>&1
}

# dumps CRIU...: a process that holds a listening TCP socket can be dumped
# (Debian 13's 4.1 fails this). The target is the real interpreter, not a
# pyenv shim, and is dumped only once it listens. It leads a session of its
# own: under a CI runner the script's session leader may be outside this
# pid namespace, which CRIU refuses to dump. On failure it prints CRIU's
# errors (less the harmless RLIMIT_NOFILE one) and the log's tail.
dumps() {
	local tmp pid py i ok=1
	tmp=$(mktemp -d)
	py=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) || py=python3
	setsid "$py" -c 'import socket,sys,time
s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen()
open(sys.argv[1],"w").close(); time.sleep(60)' "$tmp/ready" </dev/null >/dev/null 2>&1 &
	pid=$!
	for i in $(seq 100); do [ -e "$tmp/ready" ] && break; sleep 0.05; done
	mkdir "$tmp/img"
	if "$@" dump -t "$pid" -D "$tmp/img" --leave-running --shell-job --tcp-established \
		--network-lock skip -o dump.log >"$tmp/out" 2>&1; then
		ok=0
	else
		log "criu $(criu_version "$@") cannot dump a process holding a TCP socket here:"
		{ grep Error "$tmp/img/dump.log" | grep -v RLIMIT_NOFILE | head -n 5
			echo "--- last lines of dump.log:"; tail -n 15 "$tmp/img/dump.log"; tail -n 5 "$tmp/out"; } 2>/dev/null |
			sed 's/^/install-criu:   /' >&2
	fi
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	rm -rf "$tmp"
	return $ok
}

works() { checks "$@" && dumps "$@"; }

# The private criu is kept when it passes `criu check`; a failed socket dump
# is reported (with CRIU's log) but does not undo the install: torpor's own
# tests and `torpor doctor` then show exactly what does not work.
if [ -x "$prefix/usr/sbin/criu" ] && checks "${private[@]}"; then
	dumps "${private[@]}" || log "warning: keeping it anyway; snapshots of instances with TCP sockets may fail"
	log "using criu $(criu_version "${private[@]}") from $prefix"
	exit 0
fi
if command -v criu >/dev/null && works "$(command -v criu)"; then
	log "using the system's criu $(criu_version criu) at $(command -v criu)"
	exit 0
fi
if ! command -v criu >/dev/null && apt-cache show criu >/dev/null 2>&1; then
	v=$(apt-cache policy criu | awk '/Candidate:/{print $2}')
	if ver_ge "${v%%-*}" "$min"; then
		log "apt-get install criu ($v)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends criu >/dev/null
		if works "$(command -v criu)"; then
			log "using the system's criu $(criu_version criu)"
			exit 0
		fi
	else
		log "the distribution's criu is $v (< $min): not installing it"
	fi
fi

log "fetching criu from Debian $suite into $prefix"
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >"$state/sources.list"
if [ ! -f /usr/share/keyrings/debian-archive-keyring.gpg ]; then
	# Ubuntu and other derivatives: Debian's archive key, from the distro.
	log "apt-get install debian-archive-keyring"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debian-archive-keyring >/dev/null ||
		die "cannot install debian-archive-keyring, needed to verify Debian's packages"
fi
opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o Dir::State::Status=/dev/null
	-o APT::Architecture=amd64 -o Debug::NoLocking=1 -o APT::Sandbox::User=root
	-o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
	-o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
	-o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false
	-o Acquire::IndexTargets::deb::CNF::DefaultEnabled=false)
apt-get "${opts[@]}" -qq update || die "apt-get update from $mirror $suite failed"
# criu and everything it depends on (not recommends): with an empty status
# file apt treats nothing as installed, so this is the whole closure,
# glibc included — the binary is run with these libraries, not the host's.
pkgs=$(apt-cache "${opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
	--no-breaks --no-replaces --no-enhances criu | grep -v '^ ' | grep -v '^<' | sort -u)
[ -n "$pkgs" ] || die "could not resolve criu's dependencies in $suite"
(cd "$state/debs" && apt-get "${opts[@]}" -qq download $pkgs) || die "apt-get download failed"
new=$prefix.new
rm -rf "$new"
mkdir -p "$new"
for f in "$state"/debs/*.deb; do dpkg -x "$f" "$new"; done
rm -rf "$prefix.old"
[ -e "$prefix" ] && mv "$prefix" "$prefix.old"
mv "$new" "$prefix"
rm -rf "$prefix.old"
checks "${private[@]}" || die "criu $(criu_version "${private[@]}") from $suite fails 'criu check' on this kernel ($(uname -r)); see 'torpor doctor'"
dumps "${private[@]}" || log "warning: keeping it anyway; snapshots of instances with TCP sockets may fail"
log "installed criu $(criu_version "${private[@]}") into $prefix"
