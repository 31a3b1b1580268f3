/*
 * test_common.c - common/: number conversions against values worked out by
 * hand, checked arithmetic, option parsing, escaping, hashing, atomic files.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_checked.h"
#include "k3_error.h"
#include "k3_file.h"
#include "k3_hash.h"
#include "k3_log.h"
#include "k3_num.h"
#include "k3_opts.h"
#include "k3_progress.h"
#include "k3_test.h"

static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void test_bf16(void)
{
    /* bf16 is the top half of an f32: 0x3F80 = 1.0, 0xC000 = -2.0, 0x7F80 = +inf */
    CHECK_F32_BITS(k3_bf16_to_f32(0x3F80), 1.0f);
    CHECK_F32_BITS(k3_bf16_to_f32(0xC000), -2.0f);
    CHECK(isinf(k3_bf16_to_f32(0x7F80)));
    CHECK_F32_BITS(k3_bf16_to_f32(0x0001), 0x1p-133f);     /* smallest bf16 subnormal */
    CHECK_F32_BITS(k3_bf16_to_f32(0x8000), -0.0f);
    /* rounding: 1 + 2^-8 is exactly halfway between 1 and 1+2^-7: ties to even -> 1.0 */
    CHECK_EQ_U64(k3_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);
    /* 1 + 3*2^-8 is halfway between 1+2^-7 (odd mantissa 1) and 1+2^-6 (even): -> 0x3F82 */
    CHECK_EQ_U64(k3_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
    /* just above halfway rounds up */
    CHECK_EQ_U64(k3_f32_to_bf16(bits_f32(0x3F808001)), 0x3F81);
    CHECK_EQ_U64(k3_f32_to_bf16(-2.0f), 0xC000);
    /* largest finite f32 rounds to inf in bf16 (0x7F7FFFFF + rounding carries) */
    CHECK_EQ_U64(k3_f32_to_bf16(bits_f32(0x7F7FFFFF)), 0x7F80);
    /* NaN stays NaN (quiet), even a NaN whose payload would round to inf */
    uint16_t n = k3_f32_to_bf16(bits_f32(0x7F800001));
    CHECK((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);
    /* round trip of every bf16 that is not NaN */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = k3_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (k3_f32_to_bf16(f) != h) bad++;
    }
    CHECK_EQ_U64(bad, 0);
}

static void test_f16(void)
{
    CHECK_F32_BITS(k3_f16_to_f32(0x3C00), 1.0f);
    CHECK_F32_BITS(k3_f16_to_f32(0xC000), -2.0f);
    CHECK_F32_BITS(k3_f16_to_f32(0x7BFF), 65504.0f);        /* largest finite */
    CHECK_F32_BITS(k3_f16_to_f32(0x0001), 0x1p-24f);        /* smallest subnormal */
    CHECK_F32_BITS(k3_f16_to_f32(0x03FF), 1023 * 0x1p-24f); /* largest subnormal */
    CHECK_F32_BITS(k3_f16_to_f32(0x0400), 0x1p-14f);        /* smallest normal */
    CHECK(isinf(k3_f16_to_f32(0x7C00)) && k3_f16_to_f32(0xFC00) < 0);
    CHECK(isnan(k3_f16_to_f32(0x7E00)));
    CHECK_EQ_U64(k3_f32_to_f16(1.0f), 0x3C00);
    CHECK_EQ_U64(k3_f32_to_f16(65504.0f), 0x7BFF);
    CHECK_EQ_U64(k3_f32_to_f16(65519.0f), 0x7BFF);          /* below the halfway point to 65536 */
    CHECK_EQ_U64(k3_f32_to_f16(65520.0f), 0x7C00);          /* halfway: ties to even = inf */
    CHECK_EQ_U64(k3_f32_to_f16(0x1p-25f), 0x0000);          /* half the smallest subnormal: to even 0 */
    CHECK_EQ_U64(k3_f32_to_f16(3 * 0x1p-25f), 0x0002);      /* 1.5 ulp: to even 2 */
    CHECK_EQ_U64(k3_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);   /* tie: even */
    CHECK_EQ_U64(k3_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = k3_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (k3_f32_to_f16(f) != h) bad++;
    }
    CHECK_EQ_U64(bad, 0);
}

static void test_mx(void)
{
    CHECK_F32_BITS(k3_e8m0_to_f32(127), 1.0f);
    CHECK_F32_BITS(k3_e8m0_to_f32(128), 2.0f);
    CHECK_F32_BITS(k3_e8m0_to_f32(120), 0x1p-7f);
    CHECK_F32_BITS(k3_e8m0_to_f32(254), 0x1p127f);
    CHECK_F32_BITS(k3_e8m0_to_f32(1), 0x1p-126f);
    CHECK_F32_BITS(k3_e8m0_to_f32(0), 0x1p-127f);
    CHECK(isnan(k3_e8m0_to_f32(255)));
    /* E2M1: sign bit 3, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} */
    static const float want[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++) CHECK_F32_BITS(k3_e2m1_to_f32((uint8_t)c), want[c]);
    /* quantization: exact values map back to their code */
    for (int c = 0; c < 16; c++) CHECK_EQ_U64(k3_f32_to_e2m1(want[c]), c);
    /* ties go to the even code index */
    CHECK_EQ_U64(k3_f32_to_e2m1(0.25f), 0);
    CHECK_EQ_U64(k3_f32_to_e2m1(0.75f), 2);
    CHECK_EQ_U64(k3_f32_to_e2m1(1.25f), 2);
    CHECK_EQ_U64(k3_f32_to_e2m1(1.75f), 4);
    CHECK_EQ_U64(k3_f32_to_e2m1(2.5f), 4);
    CHECK_EQ_U64(k3_f32_to_e2m1(3.5f), 6);
    CHECK_EQ_U64(k3_f32_to_e2m1(5.0f), 6);
    CHECK_EQ_U64(k3_f32_to_e2m1(-5.0f), 14);
    /* nearest, off the ties; saturation; negative zero keeps its sign */
    CHECK_EQ_U64(k3_f32_to_e2m1(0.26f), 1);
    CHECK_EQ_U64(k3_f32_to_e2m1(5.01f), 7);
    CHECK_EQ_U64(k3_f32_to_e2m1(7.0f), 7);
    CHECK_EQ_U64(k3_f32_to_e2m1(1e30f), 7);
    CHECK_EQ_U64(k3_f32_to_e2m1(-0.1f), 8);
    CHECK_EQ_U64(k3_f32_to_e2m1(-0.0f), 8);
}

static void test_checked(void)
{
    uint64_t r;
    CHECK(!k3_mul_u64(1ull << 31, 1ull << 32, &r) && r == 1ull << 63);
    CHECK(k3_mul_u64(1ull << 32, 1ull << 32, &r));
    CHECK(k3_add_u64(UINT64_MAX, 1, &r));
    CHECK(!k3_add_u64(UINT64_MAX - 1, 1, &r) && r == UINT64_MAX);
    CHECK(!k3_align_up_u64(4097, 4096, &r) && r == 8192);
    CHECK(!k3_align_up_u64(4096, 4096, &r) && r == 4096);
    CHECK(k3_align_up_u64(UINT64_MAX - 10, 4096, &r));
    uint8_t b[8];
    k3_st64(b, 0x0102030405060708ull);
    CHECK(b[0] == 8 && b[7] == 1);
    CHECK_EQ_U64(k3_ld64(b), 0x0102030405060708ull);
    CHECK_EQ_U64(k3_ld32(b + 1), 0x04050607u);
}

static void test_opts(void)
{
    enum { O_OUT = K3_OPT_USER, O_THREADS, O_DRY };
    static const k3_opt opts[] = {
        {O_OUT, 'o', "output", "PATH", NULL, NULL, "output"},
        {O_THREADS, 't', "threads", "N", "2", "K3_TEST_THREADS", "threads"},
        {O_DRY, 0, "dry-run", NULL, NULL, NULL, "plan only"},
        K3_OPTS_COMMON,
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    k3_args a;
    k3_diag d;
    char *argv1[] = {"prog", "in", "-o", "out", "--threads=4", "--dry-run", "--", "-x", NULL};
    REQUIRE(k3_opts_parse(opts, n, 8, argv1, &a, &d) == K3_OK);
    CHECK_STR(k3_opt_str(&a, O_OUT), "out");
    CHECK(k3_opt_count(&a, O_DRY) == 1);
    CHECK(a.n_pos == 2 && !strcmp(a.pos[0], "in") && !strcmp(a.pos[1], "-x"));
    uint64_t v;
    CHECK(k3_opt_u64(&a, O_THREADS, 2, 0, &v, &d) == K3_OK && v == 4);

    char *argv2[] = {"prog", "-oX", "-t", "bad", NULL};
    REQUIRE(k3_opts_parse(opts, n, 4, argv2, &a, &d) == K3_OK);
    CHECK_STR(k3_opt_str(&a, O_OUT), "X");
    CHECK(k3_opt_u64(&a, O_THREADS, 2, 0, &v, &d) == K3_ERR_USAGE);
    CHECK(strstr(d.msg, "'--threads'") != NULL);

    char *argv3[] = {"prog", "--nope", NULL};
    CHECK(k3_opts_parse(opts, n, 2, argv3, &a, &d) == K3_ERR_USAGE);
    CHECK(strstr(d.msg, "unknown option '--nope'") != NULL);
    char *argv4[] = {"prog", "--output", NULL};
    CHECK(k3_opts_parse(opts, n, 2, argv4, &a, &d) == K3_ERR_USAGE);
    char *argv5[] = {"prog", "--dry-run=1", NULL};
    CHECK(k3_opts_parse(opts, n, 2, argv5, &a, &d) == K3_ERR_USAGE);

    /* environment: used when the flag is absent, overridden by it, warned when bad */
    setenv("K3_TEST_THREADS", "7", 1);
    char *argv6[] = {"prog", NULL};
    REQUIRE(k3_opts_parse(opts, n, 1, argv6, &a, &d) == K3_OK);
    CHECK(k3_opt_u64(&a, O_THREADS, 2, 0, &v, &d) == K3_OK && v == 7);
    char *argv7[] = {"prog", "-t3", NULL};
    REQUIRE(k3_opts_parse(opts, n, 2, argv7, &a, &d) == K3_OK);
    CHECK(k3_opt_u64(&a, O_THREADS, 2, 0, &v, &d) == K3_OK && v == 3);
    setenv("K3_TEST_THREADS", "many", 1);
    REQUIRE(k3_opts_parse(opts, n, 1, argv6, &a, &d) == K3_OK);
    CHECK(k3_opt_u64(&a, O_THREADS, 2, 0, &v, &d) == K3_OK && v == 2);
    unsetenv("K3_TEST_THREADS");

    CHECK(k3_parse_size("8G", 1, &v) == 0 && v == 8ull << 30);
    CHECK(k3_parse_size("512MiB", 1, &v) == 0 && v == 512ull << 20);
    CHECK(k3_parse_size("12", 0, &v) == 0 && v == 12);
    CHECK(k3_parse_size("8G", 0, &v) != 0);
    CHECK(k3_parse_size("-1", 1, &v) != 0);
    CHECK(k3_parse_size("99999999999T", 1, &v) != 0);
    k3_log_set_level(K3_LOG_NORMAL);
}

static void test_escape_errors(void)
{
    char buf[64];
    CHECK_STR(k3_escape("a\nb\x01'", 5, buf, sizeof buf), "a\\x0ab\\x01\\'");
    CHECK_STR(k3_escape("\xc3\xa9", 2, buf, sizeof buf), "\xc3\xa9");        /* valid UTF-8 kept */
    CHECK_STR(k3_escape("\xc0\xaf", 2, buf, sizeof buf), "\\xc0\\xaf");      /* overlong '/' */
    CHECK_STR(k3_escape("\xed\xa0\x80", 3, buf, sizeof buf), "\\xed\\xa0\\x80"); /* surrogate */
    /* C1 controls are valid UTF-8 but terminals act on them (U+009B is CSI): escaped */
    CHECK_STR(k3_escape("a\xc2\x9b" "2Jb", 6, buf, sizeof buf), "a\\xc2\\x9b2Jb");
    CHECK_STR(k3_escape("\xc2\x85\xc2\xa0", 4, buf, sizeof buf), "\\xc2\\x85\xc2\xa0");  /* NEL out, NBSP in */
    char small[8];
    k3_escape("abcdefghijkl", 12, small, sizeof small);
    CHECK(strlen(small) < sizeof small && strstr(small, "...") != NULL);
    CHECK(k3_exit_code(K3_OK) == 0 && k3_exit_code(K3_ERR_CORRUPT) == 1 && k3_exit_code(K3_ERR_FORMAT) == 1);
    CHECK(k3_exit_code(K3_ERR_USAGE) == 2 && k3_exit_code(K3_ERR_IO) == 3 && k3_exit_code(K3_ERR_NOSPACE) == 3);
    CHECK(k3_exit_code(K3_ERR_INTERNAL) == 4);
    CHECK_STR(k3_strerror(K3_ERR_CORRUPT), "data corrupted");
    k3_diag d;
    k3_fail(&d, K3_ERR_FORMAT, "tensor '%s' is bad", "x");
    k3_diag_wrap(&d, "'%s'", "f.safetensors");
    CHECK_STR(d.msg, "'f.safetensors': tensor 'x' is bad");
}

/* Messages on stderr never carry raw control bytes, whatever the caller formats into them. */
static void test_log_sanitized(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/test_common_log.%ld", k3_test_tmpdir(), (long)getpid());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0);
    REQUIRE(dup2(fd, 2) == 2);
    close(fd);
    k3_log_init("t");
    k3_error("name '%s' here", "a\x1b[2Jb\nc\xc2\x9b" "d\\e\xff");
    k3_warn("%s", "w\rx");
    fflush(stderr);
    REQUIRE(dup2(saved, 2) == 2);
    close(saved);
    char *text;
    size_t len;
    k3_diag d;
    REQUIRE(k3_read_file(path, 1 << 20, &text, &len, &d) == K3_OK);
    CHECK_STR(text, "t: error: name 'a\\x1b[2Jb\\x0ac\\xc2\\x9bd\\e\\xff' here\n"
                    "t: warning: w\\x0dx\n");
    free(text);
    unlink(path);
    /* the progress line's detail (a file name from a manifest) cannot hold control bytes */
    fflush(stderr);
    saved = dup(2);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0);
    REQUIRE(dup2(fd, 2) == 2);
    close(fd);
    k3_progress pr;
    k3_progress_start(&pr, "verifying", 100);
    pr.enabled = 1;                                    /* as on a terminal */
    k3_progress_update(&pr, 10, "tok\x1b]0;x\x07" "en");
    fflush(stderr);
    REQUIRE(dup2(saved, 2) == 2);
    close(saved);
    REQUIRE(k3_read_file(path, 1 << 20, &text, &len, &d) == K3_OK);
    CHECK_MSG(strstr(text, "tok\\x1b]0;x\\x07en") && !strchr(text, '\x07'), "progress line: %s", text);
    free(text);
    unlink(path);
    /* an escaped name stays as it was (no double escaping) */
    char buf[64];
    CHECK_STR(k3_escape_ctl("a\\x1b'\x01", 7, buf, sizeof buf), "a\\x1b'\\x01");
}

static void test_hash_files(void)
{
    /* XXH3 of the empty input: published constants (xxhsum -H3 / -H2 of an empty file) */
    char hex[33];
    k3_hex64(k3_xxh3_64("", 0), hex);
    CHECK_STR(hex, "2d06800538d394c2");
    k3_hex128(k3_xxh3_128("", 0), hex);
    CHECK_STR(hex, "99aa06d3014798d86001c324468d497f");
    /* streaming equals one shot, and hex parses back */
    static uint8_t buf[100000];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 31 + 7);
    k3_hasher *h = k3_hasher_new();
    REQUIRE(h);
    k3_hasher_update(h, buf, 12345);
    k3_hasher_update(h, buf + 12345, sizeof buf - 12345);
    k3_h128 a = k3_hasher_digest(h), b = k3_xxh3_128(buf, sizeof buf), c;
    CHECK(a.lo == b.lo && a.hi == b.hi);
    k3_hex128(a, hex);
    CHECK(k3_parse_hex128(hex, &c) == 0 && c.lo == a.lo && c.hi == a.hi);
    CHECK(k3_parse_hex128("xyz", &c) != 0);
    k3_hasher_free(h);

    /* atomic write: file appears whole, no temporary left, abort leaves nothing */
    const char *dir = k3_test_tmpdir();
    char sub[2048], p[4200];
    snprintf(sub, sizeof sub, "%s/test_common.%ld", dir, (long)getpid());
    snprintf(p, sizeof p, "rm -rf '%s' && mkdir -p '%s'", sub, sub);
    REQUIRE(system(p) == 0);
    k3_diag d;
    REQUIRE(k3_atomic_write_file(sub, "x.txt", "hello", 5, &d) == K3_OK);
    char *data;
    size_t len;
    snprintf(p, sizeof p, "%s/x.txt", sub);
    REQUIRE(k3_read_file(p, 100, &data, &len, &d) == K3_OK);
    CHECK(len == 5 && !memcmp(data, "hello", 5));
    free(data);
    CHECK(k3_read_file(p, 3, &data, &len, &d) == K3_ERR_FORMAT);
    k3_atomic_file af;
    REQUIRE(k3_atomic_open(&af, sub, "y.txt", &d) == K3_OK);
    k3_atomic_abort(&af);
    snprintf(p, sizeof p, "%s/y.txt", sub);
    CHECK(access(p, F_OK) != 0);
    CHECK(k3_remove_stale_tmp(sub) == 0);
    REQUIRE(k3_atomic_open(&af, sub, "z.txt", &d) == K3_OK);   /* simulate a crash: leave it */
    close(af.fd);
    CHECK(k3_remove_stale_tmp(sub) == 1);
    /* only ".NAME.k3tmp-PID" is ours: a user's file that merely contains ".k3tmp-" stays */
    static const char *const keep[] = {".notes.k3tmp-backup", ".k3tmp-12", "a.k3tmp-12", ".x.k3tmp-", ".x.k3tmp-12a",
                                       ".x.k3tmp-1.txt"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", sub, keep[i]);
        int kfd = open(p, O_WRONLY | O_CREAT, 0644);
        REQUIRE(kfd >= 0);
        close(kfd);
    }
    CHECK(k3_remove_stale_tmp(sub) == 0);
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", sub, keep[i]);
        CHECK_MSG(access(p, F_OK) == 0, "'%s' was removed", keep[i]);
    }
    CHECK(k3_is_tmp_name(".trunk-head.k3s.k3tmp-4242") && !k3_is_tmp_name(".notes.k3tmp-backup"));
    /* the lock: exclusive, released with its descriptor, and no lock file is made */
    char lk[2200];
    snprintf(lk, sizeof lk, "%s/lockdir", sub);
    REQUIRE(mkdir(lk, 0755) == 0);
    int fd1, fd2;
    REQUIRE(k3_lock_dir(lk, &fd1, &d) == K3_OK);
    CHECK(k3_lock_dir(lk, &fd2, &d) == K3_ERR_LOCKED);
    CHECK(strstr(d.msg, "is locked") != NULL);
    close(fd1);
    REQUIRE(k3_lock_dir(lk, &fd2, &d) == K3_OK);
    close(fd2);
    CHECK(rmdir(lk) == 0);                      /* still empty */
    snprintf(p, sizeof p, "%s/missing", sub);
    CHECK(k3_read_file(p, 100, &data, &len, &d) == K3_ERR_NOT_FOUND);
    snprintf(p, sizeof p, "rm -rf '%s'", sub);
    CHECK(system(p) == 0);
}

int main(void)
{
    test_bf16();
    test_f16();
    test_mx();
    test_checked();
    test_opts();
    test_escape_errors();
    test_log_sanitized();
    test_hash_files();
    return k3_test_done();
}
