/* k3_log.c - leveled messages on stderr and escaping of untrusted strings. */
#include "k3_log.h"
#include "k3_utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *g_prog = "k3";
static int g_level = K3_LOG_NORMAL;

void k3_log_init(const char *prog)
{
    const char *slash = prog ? strrchr(prog, '/') : NULL;
    g_prog = slash ? slash + 1 : (prog ? prog : "k3");
}

const char *k3_log_prog(void) { return g_prog; }
void k3_log_set_level(int level) { g_level = level < 0 ? 0 : level; }
int k3_log_level(void) { return g_level; }

static void vlog(const char *tag, const char *fmt, va_list ap)
{
    /* one fprintf per line so concurrent writers do not interleave mid-line;
       messages hold untrusted names: no raw control byte may reach the terminal */
    char line[4096], safe[4 * sizeof line + 8];
    vsnprintf(line, sizeof line, fmt, ap);
    k3_escape_ctl(line, strlen(line), safe, sizeof safe);
    fprintf(stderr, "%s: %s%s\n", g_prog, tag, safe);
}

void k3_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog("error: ", fmt, ap);
    va_end(ap);
}

void k3_warn(const char *fmt, ...)
{
    if (g_level < K3_LOG_NORMAL) return;
    va_list ap;
    va_start(ap, fmt);
    vlog("warning: ", fmt, ap);
    va_end(ap);
}

void k3_info(const char *fmt, ...)
{
    if (g_level < K3_LOG_VERBOSE) return;
    va_list ap;
    va_start(ap, fmt);
    vlog("", fmt, ap);
    va_end(ap);
}

void k3_debug(const char *fmt, ...)
{
    if (g_level < K3_LOG_DEBUG) return;
    va_list ap;
    va_start(ap, fmt);
    vlog("debug: ", fmt, ap);
    va_end(ap);
}

static char *escape(const char *in, size_t len, char *out, size_t cap, int quotes)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t o = 0;
    if (cap == 0) return out;
    for (size_t i = 0; i < len;) {
        char tmp[12];
        size_t tl;
        size_t seq = k3_utf8_seq(s + i, len - i, NULL);
        if (seq == 2 && s[i] == 0xC2 && s[i + 1] < 0xA0) {     /* C1 control U+0080..U+009F */
            tl = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x\\x%02x", s[i], s[i + 1]);
        } else if (seq > 1) {
            memcpy(tmp, s + i, seq);
            tl = seq;
        } else if (quotes && (s[i] == '\\' || s[i] == '\'')) {
            tmp[0] = '\\'; tmp[1] = (char)s[i]; tl = 2;
            seq = 1;
        } else if (s[i] >= 0x20 && s[i] < 0x7F) {
            tmp[0] = (char)s[i]; tl = 1;
            seq = 1;
        } else {
            tl = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", s[i]);
            seq = 1;
        }
        if (o + tl + 4 > cap) {          /* keep room for "..." and NUL */
            if (cap >= 4) { memcpy(out + (o < cap - 4 ? o : cap - 4), "...", 4); }
            else out[0] = '\0';
            return out;
        }
        memcpy(out + o, tmp, tl);
        o += tl;
        i += seq;
    }
    out[o] = '\0';
    return out;
}

char *k3_escape(const char *in, size_t len, char *out, size_t cap) { return escape(in, len, out, cap, 1); }
char *k3_escape_ctl(const char *in, size_t len, char *out, size_t cap) { return escape(in, len, out, cap, 0); }

void k3_escape_ctl_in_place(char *s, size_t cap)
{
    size_t n = strnlen(s, cap), i = 0;
    while (i < n && (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7F) i++;
    if (i == n) return;                            /* plain ASCII: nothing to do */
    char safe[4096];
    k3_escape_ctl(s, n, safe, cap < sizeof safe ? cap : sizeof safe);
    snprintf(s, cap, "%s", safe);
}

void k3_json_str(FILE *f, const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') { fputc('\\', f); fputc(c, f); }
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\u%04x", c);
        else if (c >= 0x80) {
            size_t seq = k3_utf8_seq(s + i, len - i, NULL);
            if (seq == 0) { fputs("\\ufffd", f); continue; }
            fwrite(s + i, 1, seq, f);
            i += seq - 1;
        } else fputc(c, f);
    }
    fputc('"', f);
}
