"""Print the code points the split pattern's classes gain from the `regex`
module's Unicode version over PCRE2's: the U15_* ranges of
k3run/tokenizer_encode.c.

PCRE2 10.42 (Debian 12) has Unicode 14.0 tables, as has Python 3.11's
unicodedata; the `regex` module (2022.10.31) has Unicode 15.0. So a code point
that `regex` puts in \\p{Ll} (say) while unicodedata 14 does not is one PCRE2
misses. \\p{Han} (Script=Han) has no unicodedata equivalent: its additions are
the Han code points unassigned in 14.0. Only additions are listed (no code
point left a class between 14.0 and 15.0). Run with /usr/bin/python3; if the
output differs from the macros, update them (test_tokenizer_c.ClassTest checks
the result against the reference, code point by code point).
"""

import unicodedata

import regex


def ranges(cps):
    out = []
    for c in cps:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return "".join("\\x{%X}" % a if a == b else "\\x{%X}-\\x{%X}" % (a, b) for a, b in out)


def main():
    print("# regex module %s, unicodedata %s" % (regex.__version__, unicodedata.unidata_version))
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    han = regex.compile(r"\p{Han}")
    print("U15_HAN", ranges(c for c in cps if han.match(chr(c)) and
                            unicodedata.category(chr(c)) == "Cn"))
    for cat in ("Ll", "Lm", "Lo", "M", "N"):
        r = regex.compile(r"\p{%s}" % cat)
        print("U15_%s" % cat.upper(), ranges(
            c for c in cps if r.match(chr(c)) and not unicodedata.category(chr(c)).startswith(cat)))
    for cat in ("Lu", "Lt"):
        r = regex.compile(r"\p{%s}" % cat)
        extra = [c for c in cps if r.match(chr(c)) and unicodedata.category(chr(c)) != cat]
        print("U15_%s" % cat.upper(), ranges(extra) or "(none)")


if __name__ == "__main__":
    main()
