#!/bin/sh
# A man page (section 1) from a k3 tool's own --help, so the two never drift (the build runs it;
# README "Install"). Every k3 tool prints its help in one shape (common/k3_opts.c): "Usage:" lines,
# paragraphs, then sections that begin with a line ending in ':' ("Options:", "Examples:", ...),
# each option a line "  -x, --long ARG   text". That shape is all this reads.
#   scripts/help2man.sh NAME VERSION OUT [COMMAND...]
# writes OUT: the page of NAME (e.g. k3run-serve), from `COMMAND --help` (default: NAME --help).
set -eu
name=$1 version=$2 out=$3
shift 3
[ $# -gt 0 ] || set -- "$name"
"$@" --help | LC_ALL=C awk -v name="$name" -v version="$version" '
function esc(s) {                      # roff: backslashes, then a leading dot or quote, then hyphens
    gsub(/\\/, "\\e", s)
    if (s ~ /^[.'"'"']/) s = "\\&" s
    gsub(/-/, "\\-", s)
    return s
}
function flush_para(   n, k, l) {     # each line escaped on its own (a leading dot or quote)
    if (para == "") return
    print ".PP"
    n = split(para, l, "\n")
    for (k = 1; k <= n; k++) print esc(l[k])
    para = ""
}
BEGIN { sec = "usage"; ntext = 0 }
{
    line = $0
    pl = prev; prev = line                 # the line before this one
    if (sec == "usage") {
        if (line ~ /^Usage: /) { syn[++nsyn] = substr(line, 8); next }
        if (line ~ /^       / && nsyn) { sub(/^ +/, "", line); syn[++nsyn] = line; next }
        if (line == "") { sec = "desc"; next }
    }
    if (started && pl == "" && line ~ /^[A-Z][A-Za-z ]*( \([^)]*\))?:$/) {   # a section header: "Options:"
        flush_para()
        sub(/:$/, "", line)
        cur = toupper(line)
        sub(/ \(.*$/, "", cur)
        printf ".SH \"%s\"\n", cur == "OPTIONS" ? "OPTIONS" : cur
        if (line ~ /\(/) { note = line; sub(/^[^(]*\(/, "(", note); print esc(note) }
        sec = (cur == "OPTIONS") ? "opts" : "list"
        next
    }
    if (sec == "desc") {
        if (!started) {
            started = 1
            print ".TH " toupper(name) " 1 \"\" \"k3 " version "\" \"User Commands\""
            print ".SH NAME"
            first = line; sub(/[.:].*$/, "", first)
            print esc(name) " \\- " esc(tolower(substr(first, 1, 1)) substr(first, 2))
            print ".SH SYNOPSIS"
            print ".nf"
            for (i = 1; i <= nsyn; i++) print esc(syn[i])
            print ".fi"
            print ".SH DESCRIPTION"
        }
        if (line == "") { flush_para(); next }
        para = para == "" ? line : para "\n" line
        next
    }
    if (sec == "opts") {
        if (line ~ /^  +-/) {
            o = line; sub(/^ +/, "", o)
            # the option part ends at the first run of two or more spaces
            i = match(o, /  +/)
            if (i) { head = substr(o, 1, i - 1); text = substr(o, i + RLENGTH) } else { head = o; text = "" }
            print ".TP"
            n = split(head, w, " "); h = ""
            for (k = 1; k <= n; k++) {          # options bold, their argument italic
                tok = w[k]; comma = sub(/,$/, "", tok)
                tok = (tok ~ /^-/) ? "\\fB" esc(tok) "\\fR" : "\\fI" esc(tok) "\\fR"
                h = h (k > 1 ? " " : "") tok (comma ? "," : "")
            }
            print h
            if (text != "") print esc(text)
            next
        }
        if (line ~ /^ +[^ ]/) { t = line; sub(/^ +/, "", t); print esc(t); next }
        if (line == "") next
    }
    if (sec == "list") {
        if (line == "") { print ".PP"; sec = "desc"; next }
        t = line; sub(/^  /, "", t)
        print ".nf"; print esc(t); print ".fi"
        next
    }
}
END {
    flush_para()
    print ".SH \"SEE ALSO\""
    print "k3run(1), k3run\\-chat(1), k3run\\-serve(1), k3run\\-batch(1), k3pack(1), k3verify(1), k3inspect(1);"
    print "the documents under /usr/share/doc/k3 (docs/ in the source)."
}
' > "$out.tmp"
mv "$out.tmp" "$out"
