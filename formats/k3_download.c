/*
 * k3_download.c - a checkpoint's files against its publisher's hashes
 * (k3_download.h): the Hugging Face cache's blob names and SUMS files.
 */
#define _GNU_SOURCE
#include "k3_download.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cpuid.h>
#include <nettle/version.h>

#include "k3_file.h"
#include "k3_log.h"

#define DL_CHUNK (8u << 20)

void k3_dl_hex(const uint8_t *digest, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[digest[i] >> 4];
        out[2 * i + 1] = hx[digest[i] & 15];
    }
    out[2 * n] = 0;
}

int k3_dl_unhex(const char *s, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int c = s[i], v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0) return 0;
        if (i % 2) out[i / 2] |= (uint8_t)v;
        else out[i / 2] = (uint8_t)(v << 4);
    }
    return 1;
}

static const char *last_part(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static k3_err add(k3_dl *dl, const char *name, k3_dl_kind kind, const uint8_t *digest, const char *from, k3_diag *d)
{
    char esc[300];
    for (size_t i = 0; i < dl->n; i++) {
        k3_dl_want *o = &dl->w[i];
        if (strcmp(o->name, name)) continue;
        if (o->kind == kind) {
            if (memcmp(o->digest, digest, kind == K3_DL_SHA256 ? 32 : 20))
                return k3_fail(d, K3_ERR_FORMAT, "'%s' has two different hashes: in %s and in %s",
                               k3_escape(name, strlen(name), esc, sizeof esc), o->from, from);
            return K3_OK;
        }
        if (kind == K3_DL_GIT_SHA1) return K3_OK;        /* a SHA-256 is known already: the stronger one */
        o->kind = kind;                                  /* a SHA-256 replaces git's SHA-1 */
        memcpy(o->digest, digest, 32);
        snprintf(o->from, sizeof o->from, "%s", from);
        return K3_OK;
    }
    k3_dl_want *nw = realloc(dl->w, (dl->n + 1) * sizeof *nw);
    if (!nw) return k3_fail(d, K3_ERR_NOMEM, "out of memory");
    dl->w = nw;
    k3_dl_want *w = &dl->w[dl->n++];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->kind = kind;
    memcpy(w->digest, digest, kind == K3_DL_SHA256 ? 32 : 20);
    snprintf(w->from, sizeof w->from, "%s", from);
    return K3_OK;
}

/* The Hub cache: NAME -> ../../blobs/<64 hex: SHA-256 | 40 hex: git SHA-1>. */
static k3_err hub_links(k3_dl *dl, const char *dir, k3_diag *d)
{
    DIR *dp = opendir(dir);
    if (!dp) return K3_OK;                               /* a lone file: its directory is read elsewhere */
    k3_err e = K3_OK;
    struct dirent *de;
    while (!e && (de = readdir(dp))) {
        if (de->d_name[0] == '.') continue;
        char path[4096], target[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= sizeof path) continue;
        struct stat st;
        if (lstat(path, &st) || !S_ISLNK(st.st_mode)) continue;
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        const char *b = last_part(target);
        size_t bl = strlen(b);
        if (b - target < 6 || strncmp(b - 6, "blobs/", 6) || (bl != 64 && bl != 40)) continue;
        uint8_t dg[32] = {0};
        if (!k3_dl_unhex(b, bl, dg)) continue;
        char from[320];
        snprintf(from, sizeof from, "the Hugging Face cache (blob %.64s)", b);
        e = add(dl, de->d_name, bl == 64 ? K3_DL_SHA256 : K3_DL_GIT_SHA1, dg, from, d);
        dl->hub = 1;
    }
    closedir(dp);
    return e;
}

/* One SUMS line: GNU ("HEX  NAME", "HEX *NAME", "\HEX  ESCAPED") or BSD ("SHA256 (NAME) = HEX"). */
static int sums_line(char *l, char **name, uint8_t *dg)
{
    if (!strncmp(l, "SHA256 (", 8)) {
        char *end = strstr(l, ") = ");
        if (!end || strlen(end + 4) != 64 || !k3_dl_unhex(end + 4, 64, dg)) return 0;
        *end = 0;
        *name = l + 8;
        return **name != 0;
    }
    int escaped = l[0] == '\\';
    if (escaped) l++;
    if (strlen(l) < 67 || !k3_dl_unhex(l, 64, dg) || l[64] != ' ' || (l[65] != ' ' && l[65] != '*')) return 0;
    char *n = l + 66;
    if (escaped) {                                       /* coreutils: \\ and \n */
        char *o = n;
        for (char *p = n; *p; p++) {
            if (*p == '\\' && (p[1] == '\\' || p[1] == 'n')) { *o++ = p[1] == 'n' ? '\n' : '\\'; p++; }
            else *o++ = *p;
        }
        *o = 0;
    }
    *name = n;
    return *n != 0;
}

static k3_err sums_file(k3_dl *dl, const char *path, k3_diag *d)
{
    char *text;
    size_t len;
    k3_err e = k3_read_file(path, 64u << 20, &text, &len, d);
    if (e) return e;
    if (memchr(text, 0, len)) {
        free(text);
        return k3_fail(d, K3_ERR_FORMAT, "'%s': not a SUMS file (it holds a NUL byte)", path);
    }
    unsigned no = 0, good = 0;
    for (char *l = text, *next; !e && l < text + len; l = next) {
        char *nl = memchr(l, '\n', (size_t)(text + len - l));
        next = nl ? nl + 1 : text + len;
        if (nl) *nl = 0;
        no++;
        size_t ll = strlen(l);
        if (ll && l[ll - 1] == '\r') l[--ll] = 0;
        if (!ll || l[0] == '#') continue;
        char *name;
        uint8_t dg[32];
        if (!sums_line(l, &name, dg)) {
            e = k3_fail(d, K3_ERR_FORMAT, "'%s' line %u: not a SHA-256 line (\"<64 hex digits>  NAME\", as "
                        "sha256sum writes)", path, no);
            break;
        }
        char from[320];
        snprintf(from, sizeof from, "'%s' line %u", path, no);
        e = add(dl, last_part(name), K3_DL_SHA256, dg, from, d);
        good++;
    }
    free(text);
    if (!e && !good) e = k3_fail(d, K3_ERR_FORMAT, "'%s' has no SHA-256 line", path);
    return e;
}

k3_err k3_dl_load(k3_dl *dl, const char *dir, const char *sums, k3_diag *d)
{
    memset(dl, 0, sizeof *dl);
    k3_err e = dir ? hub_links(dl, dir, d) : K3_OK;
    if (!e && sums) {
        dl->sums = sums;
        e = sums_file(dl, sums, d);
    }
    if (e) k3_dl_free(dl);
    return e;
}

void k3_dl_free(k3_dl *dl)
{
    free(dl->w);
    memset(dl, 0, sizeof *dl);
}

const k3_dl_want *k3_dl_find(const k3_dl *dl, const char *name)
{
    for (size_t i = 0; dl && i < dl->n; i++)
        if (!strcmp(dl->w[i].name, name)) return &dl->w[i];
    return NULL;
}

const char *k3_dl_what(const k3_dl *dl, char *buf, size_t cap)
{
    if (dl->hub && dl->sums) snprintf(buf, cap, "the Hugging Face cache's hashes and '%s'", dl->sums);
    else if (dl->hub) snprintf(buf, cap, "the Hugging Face cache's hashes");
    else if (dl->sums) snprintf(buf, cap, "'%s'", dl->sums);
    else return NULL;
    return buf;
}

/* ---- hashing ---------------------------------------------------------------- */

void k3_dl_hash_begin(k3_dl_hash *h, const k3_dl_want *w, uint64_t size)
{
    memset(h, 0, sizeof *h);
    sha256_init(&h->s);
    h->git = w && w->kind == K3_DL_GIT_SHA1;
    if (h->git) {                                        /* git hashes "blob <size>\0" + content */
        char pre[40];
        int n = snprintf(pre, sizeof pre, "blob %llu", (unsigned long long)size);
        sha1_init(&h->g);
        sha1_update(&h->g, (size_t)n + 1, (const uint8_t *)pre);
    }
}

void k3_dl_hash_update(k3_dl_hash *h, const void *p, size_t n)
{
    sha256_update(&h->s, n, p);
    if (h->git) sha1_update(&h->g, n, p);
    h->n += n;
}

k3_err k3_dl_hash_end(k3_dl_hash *h, const k3_dl_want *w, const char *path, uint8_t sha256[32], k3_diag *d)
{
    uint8_t s[32], g[20];
    sha256_digest(&h->s, sizeof s, s);
    if (sha256) memcpy(sha256, s, 32);
    if (!w) return K3_OK;
    const uint8_t *got = s;
    size_t n = 32;
    if (w->kind == K3_DL_GIT_SHA1) {
        sha1_digest(&h->g, sizeof g, g);
        got = g;
        n = 20;
    }
    if (!memcmp(got, w->digest, n)) return K3_OK;
    char want_hex[65], got_hex[65];
    k3_dl_hex(w->digest, n, want_hex);
    k3_dl_hex(got, n, got_hex);
    return k3_fail(d, K3_ERR_CORRUPT, "'%s': its %s is %s, but %s says %s: the download is damaged (download this "
                   "file again)", path, n == 32 ? "SHA-256" : "git blob SHA-1", got_hex, w->from, want_hex);
}

k3_err k3_dl_hash_file(const char *path, const k3_dl_want *w, uint8_t sha256[32], uint64_t *bytes, k3_diag *d)
{
    int fd = k3_open_read(path);
    if (fd < 0) return k3_fail(d, errno == ENOENT ? K3_ERR_NOT_FOUND : K3_ERR_IO, "cannot open '%s': %s", path,
                               strerror(errno));
    struct stat st;
    uint8_t *buf = malloc(DL_CHUNK);                     /* [DL_CHUNK] read buffer */
    k3_err e = !buf ? k3_fail(d, K3_ERR_NOMEM, "out of memory")
             : fstat(fd, &st) ? k3_fail(d, K3_ERR_IO, "cannot stat '%s': %s", path, strerror(errno)) : K3_OK;
    k3_dl_hash h;
    if (!e) {
        k3_dl_hash_begin(&h, w, (uint64_t)st.st_size);
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        for (uint64_t off = 0; !e && off < (uint64_t)st.st_size;) {
            size_t n = (uint64_t)st.st_size - off < DL_CHUNK ? (size_t)((uint64_t)st.st_size - off) : DL_CHUNK;
            if (!(e = k3_pread_full(fd, buf, n, off, path, d))) {
                k3_dl_hash_update(&h, buf, n);
                posix_fadvise(fd, (off_t)off, (off_t)n, POSIX_FADV_DONTNEED);
                off += n;
            }
        }
        if (!e) e = k3_dl_hash_end(&h, w, path, sha256, d);
        if (bytes) *bytes = h.n;
    }
    free(buf);
    close(fd);
    return e;
}

void k3_dl_describe(char *out, size_t cap)
{
    unsigned a = 0, b = 0, c = 0, dd = 0;
    int sha = __get_cpuid_count(7, 0, &a, &b, &c, &dd) && (b >> 29 & 1);   /* CPUID.7.0:EBX.SHA */
    snprintf(out, cap, "SHA-256: nettle %d.%d (this CPU's SHA extensions: %s)", nettle_version_major(),
             nettle_version_minor(), sha ? "yes, used" : "no");
}
