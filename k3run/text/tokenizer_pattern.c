/*
 * tokenizer_pattern.c - Kimi's split pattern (pat_str) rewritten for PCRE2
 * 10.42 so that it matches what the Python `regex` module (Unicode 15.0)
 * does, and its compilation (with JIT where PCRE2 has it) when a tokenizer
 * is loaded (tokenizer_impl.h). docs/k3run-tokenizer.md gives each change
 * and the exhaustive test behind it.
 */
#include "tokenizer_impl.h"

/* Code points Unicode 15.0 (the regex module) adds to each class over PCRE2
   10.42's Unicode 14.0 tables (tests/tokenizer/unicode_ranges.py prints them). */
#define U15_HAN "\\x{2B739}\\x{31350}-\\x{323AF}"
#define U15_LL "\\x{1DF25}-\\x{1DF2A}"
#define U15_LM "\\x{1E030}-\\x{1E06D}\\x{1E4EB}"
#define U15_LO "\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}" \
    "\\x{1342F}\\x{13441}-\\x{13446}\\x{1B132}\\x{1B155}\\x{1E4D0}-\\x{1E4EA}" U15_HAN
#define U15_M "\\x{CF3}\\x{ECE}\\x{10EFD}-\\x{10EFF}\\x{11241}\\x{11F00}-\\x{11F01}\\x{11F03}" \
    "\\x{11F34}-\\x{11F3A}\\x{11F3E}-\\x{11F42}\\x{13440}\\x{13447}-\\x{13455}\\x{1E08F}" \
    "\\x{1E4EC}-\\x{1E4EF}"
#define U15_N "\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}"
#define U15_LN U15_LL U15_LM U15_LO U15_N

/* Unicode White_Space (regex's and Rust's \s). PCRE2's \s adds U+180E. */
#define WS "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
    "\\x{202F}\\x{205F}\\x{3000}"
/* Script=Han. A bare \p{Han} is Script_Extensions in PCRE2 >= 10.40 (adds 、。「」...). */
#define HAN "[\\p{sc:Han}" U15_HAN "]"
/* [X&&[^\p{Han}]] as (?:(?!\p{Han})[X]): PCRE2 10.42 has no class intersection. */
#define UPPER "(?:(?!" HAN ")[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}" U15_LM U15_LO U15_M "])"
#define LOWER "(?:(?!" HAN ")[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}" U15_LL U15_LM U15_LO U15_M "])"
#define PRE "[^\\r\\n\\p{L}\\p{N}" U15_LN "]?"
#define CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"

const char k3_tok_pattern[] =
    HAN "+"
    "|" PRE UPPER "*" LOWER "+" CONTRACTION
    "|" PRE UPPER "+" LOWER "*" CONTRACTION
    "|[\\p{N}" U15_N "]{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}" U15_LN "]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

const char *k3_tok_split_pattern(void) { return k3_tok_pattern; }

k3_err k3_tok_compile_pattern(k3_tok *t, k3_diag *d)
{
    int err;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)k3_tok_pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return k3_fail(d, K3_ERR_INTERNAL, "cannot compile the split pattern at offset %zu: %s",
                       (size_t)at, (const char *)msg);
    }
    /* Without JIT support (some builds) pcre2_match interprets: slower, same result. */
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    return K3_OK;
}
