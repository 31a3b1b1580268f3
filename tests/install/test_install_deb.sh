#!/bin/sh
# install.deb: build the Debian package, install it with apt, run it from /usr/bin, remove it.
# Exit 77 (skipped) with the reason where that cannot be done here.
set -eu
tree=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v apt-get >/dev/null && command -v dpkg >/dev/null || skip "no apt-get or dpkg: not a Debian system"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    sudo -n true 2>/dev/null || skip "not root and no password-less sudo: apt cannot install here"
    SUDO="sudo -n"
fi
dpkg -s k3 >/dev/null 2>&1 && skip "a k3 package is installed already: not touching it"
[ ! -e /usr/bin/k3run ] || skip "/usr/bin/k3run exists and is not from a k3 package: not touching it"
deb=$("$src/scripts/package.sh" "$tree" | tail -n 1)
[ -f "$deb" ] || fail "scripts/package.sh made no package"
dpkg-deb -f "$deb" Depends | grep -q libmicrohttpd || fail "Depends lacks libmicrohttpd: $(dpkg-deb -f "$deb" Depends)"
dpkg-deb -f "$deb" Depends | grep -qi mpi && fail "the package depends on MPI: $(dpkg-deb -f "$deb" Depends)"
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-download "$deb" >/dev/null 2>"$tree/apt.err" ||
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$deb" >/dev/null 2>>"$tree/apt.err" ||
    fail "apt-get install: $(cat "$tree/apt.err")"
trap 'DEBIAN_FRONTEND=noninteractive $SUDO apt-get remove -y -qq --purge k3 >/dev/null 2>&1 || true' EXIT
/usr/bin/k3run --version | head -n 1 | grep -q "^k3run " || fail "/usr/bin/k3run --version"
/usr/bin/k3run --version | grep -q "^MPI: no" || fail "the package's k3run was built with MPI"
man -w k3run-serve >/dev/null 2>&1 || fail "man k3run-serve: not found"
files=$(dpkg -L k3)
DEBIAN_FRONTEND=noninteractive $SUDO apt-get remove -y -qq --purge k3 >/dev/null 2>&1 || fail "apt-get remove"
trap - EXIT
dpkg -s k3 >/dev/null 2>&1 && fail "k3 still installed after apt-get remove"
left=""
for f in $files; do [ -f "$f" ] && left="$left $f"; done
[ -z "$left" ] || fail "left behind after removal:$left"
echo "built $(basename "$deb"), installed with apt, ran /usr/bin/k3run, removed cleanly"
