/*
 * k3_test.h - a minimal test harness: CHECK keeps going and counts failures,
 * REQUIRE stops the test. A test file ends with `return k3_test_done();`.
 */
#ifndef K3_TEST_H
#define K3_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int k3_test_failures;
static int k3_test_checks;

#define CHECK(cond) do { k3_test_checks++; if (!(cond)) { k3_test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { k3_test_checks++; if (!(cond)) { k3_test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define REQUIRE(cond) do { k3_test_checks++; if (!(cond)) { \
    fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); exit(1); } } while (0)
#define CHECK_EQ_U64(a, b) do { unsigned long long _a = (a), _b = (b); k3_test_checks++; \
    if (_a != _b) { k3_test_failures++; fprintf(stderr, "%s:%d: %s == %llu, expected %s == %llu\n", \
    __FILE__, __LINE__, #a, _a, #b, _b); } } while (0)
#define CHECK_STR(a, b) do { const char *_a = (a), *_b = (b); k3_test_checks++; \
    if (!_a || !_b || strcmp(_a, _b)) { k3_test_failures++; fprintf(stderr, \
    "%s:%d: \"%s\" != \"%s\"\n", __FILE__, __LINE__, _a ? _a : "(null)", _b ? _b : "(null)"); } } while (0)
/* bitwise float equality (distinguishes -0 and +0; NaN == NaN) */
#define CHECK_F32_BITS(a, b) do { float _a = (a), _b = (b); k3_test_checks++; \
    if (memcmp(&_a, &_b, 4) && !(isnan(_a) && isnan(_b))) { k3_test_failures++; \
    fprintf(stderr, "%s:%d: %s = %a, expected %a\n", __FILE__, __LINE__, #a, _a, _b); } } while (0)

static inline int k3_test_done(void)
{
    if (k3_test_failures) {
        fprintf(stderr, "%d of %d checks failed\n", k3_test_failures, k3_test_checks);
        return 1;
    }
    printf("%d checks passed\n", k3_test_checks);
    return 0;
}

/* Scratch directory for a test (created on demand): $K3_TEST_TMP or /tmp. */
static inline const char *k3_test_tmpdir(void)
{
    const char *t = getenv("K3_TEST_TMP");
    static char buf[4096];
    if (!t || !*t) t = "/tmp";
    snprintf(buf, sizeof buf, "mkdir -p '%s'", t);
    if (system(buf) != 0) return "/tmp";
    return t;
}

#endif
