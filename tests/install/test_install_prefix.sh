#!/bin/sh
# install.prefix: cmake --install BUILD --prefix DIR, then use what it installed.
set -eu
build=$1 prefix=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
src=$(cd "$(dirname "$0")/../.." && pwd)
for t in k3run k3pack k3verify k3inspect; do
    [ -x "$prefix/bin/$t" ] || fail "$t not installed"
    v=$("$prefix/bin/$t" --version) || fail "$t --version"
    echo "$v" | head -n 1 | grep -q "^$t [0-9][0-9.]* (commit [0-9a-f]\{12\}\(+changes\)\?)$" || fail "$t --version: $v"
    # the commit it names is one of this repository's (the one it was built from)
    c=$(echo "$v" | head -n 1 | sed 's/.*(commit \([0-9a-f]*\).*/\1/')
    if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$src" cat-file -e "$c^{commit}" 2>/dev/null || fail "$t --version names commit $c, not in this repository"
    fi
done
"$prefix/bin/k3run" --version | grep -q "^kernels: scalar, avx2, avx512" || fail "k3run --version lacks the kernels"
"$prefix/bin/k3run" --version | grep -q "^MPI: " || fail "k3run --version lacks MPI"
"$prefix/bin/k3run" --version | grep -q "^HTTPS: " || fail "k3run --version lacks HTTPS"
# k3pack and k3verify: what checks a download, and whether this CPU's SHA extensions (the kernel's
# sha_ni flag, read here) are there for it
sha=no
grep -qw sha_ni /proc/cpuinfo && sha="yes, used"
for t in k3pack k3verify; do
    "$prefix/bin/$t" --version | grep -q "^SHA-256: nettle [0-9]*\.[0-9]* (this CPU's SHA extensions: $sha)" \
        || fail "$t --version: $("$prefix/bin/$t" --version)"
done
for p in k3run k3run-chat k3run-serve k3run-batch k3pack k3verify k3inspect; do
    page="$prefix/share/man/man1/$p.1"
    [ -s "$page" ] || fail "no man page $p.1"
    out=$(MANWIDTH=100 man -l "$page" 2>"$prefix/man.err") || fail "man -l $p.1"
    [ ! -s "$prefix/man.err" ] || fail "man -l $p.1 warns: $(cat "$prefix/man.err")"
    echo "$out" | grep -q "^NAME" || fail "$p.1 has no NAME"
    echo "$out" | grep -q "^OPTIONS" || fail "$p.1 has no OPTIONS"
    echo "$out" | grep -q -- "--help" || fail "$p.1 does not list --help"
done
man -l "$prefix/share/man/man1/k3run-serve.1" | grep -q -- "--tls-cert" || fail "k3run-serve.1 lacks --tls-cert"
[ -f "$prefix/share/doc/k3/README.md" ] && [ -f "$prefix/share/doc/k3/FORMAT.md" ] || fail "docs not installed"
comp="$prefix/share/bash-completion/completions"
for t in k3run k3pack k3verify k3inspect; do [ -f "$comp/$t" ] || fail "no completion for $t"; done
got=$(PATH="$prefix/bin:$PATH" bash -c '. "$1"; COMP_WORDS=(k3run se); COMP_CWORD=1; _k3; echo "${COMPREPLY[*]}"' sh "$comp/k3run")
[ "$got" = "serve" ] || fail "k3run se<TAB>: '$got'"
got=$(PATH="$prefix/bin:$PATH" bash -c '. "$1"; COMP_WORDS=(k3run serve --max-conns); COMP_CWORD=2; _k3; echo "${COMPREPLY[*]}"' sh "$comp/k3run")
[ "$got" = "--max-conns --max-conns-per-ip" ] || fail "k3run serve --max-conns<TAB>: '$got'"
got=$(PATH="$prefix/bin:$PATH" bash -c '. "$1"; COMP_WORDS=(k3verify --chec); COMP_CWORD=1; _k3; echo "${COMPREPLY[*]}"' sh "$comp/k3verify")
[ "$got" = "--checkpoint" ] || fail "k3verify --chec<TAB>: '$got'"
echo "installed into $prefix: 4 tools, 7 man pages, completions, docs"
