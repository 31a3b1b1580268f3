/*
 * k3_alloc_count.c - an LD_PRELOAD library that counts a process's heap and
 * mapping calls, for tests/run/test_k3run_alloc.py ("nothing is allocated in
 * the token loop").
 *
 *   K3_ALLOC_COUNT_OUT=FILE LD_PRELOAD=.../libk3_alloc_count.so k3run ...
 *
 * At exit the process writes one JSON object to FILE (a "%p" in FILE becomes
 * the pid, so a child that execs with the same environment does not overwrite
 * its parent's file):
 *
 *   {"pid": 123, "malloc": 10, "calloc": 2, "realloc": 1, "reallocarray": 0,
 *    "posix_memalign": 4, "aligned_alloc": 0, "memalign": 0, "valloc": 0,
 *    "pvalloc": 0, "free": 15, "mmap": 3, "munmap": 1, "mremap": 0,
 *    "allocs": 17, "alloc_bytes": 4096}
 *
 * "free" counts frees of non-NULL pointers; "allocs" is the sum of every
 * allocating call (the malloc family, not mmap); "alloc_bytes" the bytes they
 * asked for (realloc: its new size).
 *
 * How it forwards without dlsym recursion: the malloc family goes straight to
 * glibc's own exported entry points (__libc_malloc, __libc_calloc,
 * __libc_realloc, __libc_free, __libc_memalign, __libc_valloc,
 * __libc_pvalloc), which never call back into the interposed symbols, so there
 * is no bootstrap phase at all (dlsym itself may calloc: that lands in our
 * calloc, which already works). posix_memalign and aligned_alloc are built on
 * __libc_memalign with glibc's argument checks. Only mmap/munmap/mremap are
 * looked up with dlsym(RTLD_NEXT), lazily, on their first call.
 *
 * Counters are atomics (relaxed): k3run calls in from OpenMP threads.
 * Allocations the C library makes internally for itself (its own mmap for
 * large blocks, the dynamic loader's) are not seen; allocations made by
 * libgomp, jansson, stdio and the like through malloc are.
 *
 * Tracing (to find an allocation site): K3_ALLOC_TRACE=FILE appends, for every
 * counted call, a record
 *
 *   @ malloc 4096
 *   <backtrace_symbols_fd lines: binary(function+offset) [address]>
 *   (blank line)
 *
 * with a lock around each record. Calls made while a thread is inside the
 * library (backtrace's first call loads libgcc_s, which allocates) are passed
 * through uncounted. K3_ALLOC_TRACE_SKIP=N skips the first N records.
 */
#define _GNU_SOURCE
#undef _FILE_OFFSET_BITS            /* mmap and mmap64 are both defined here: no header redirection */
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

/* glibc's exported allocator entry points (GLIBC_2.2.5) */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

#define EXPORT __attribute__((visibility("default")))

enum { C_MALLOC, C_CALLOC, C_REALLOC, C_REALLOCARRAY, C_POSIX_MEMALIGN, C_ALIGNED_ALLOC, C_MEMALIGN, C_VALLOC,
       C_PVALLOC, C_FREE, C_MMAP, C_MUNMAP, C_MREMAP, N_COUNTERS };
static const char *const names[N_COUNTERS] = {"malloc", "calloc", "realloc", "reallocarray", "posix_memalign",
                                              "aligned_alloc", "memalign", "valloc", "pvalloc", "free", "mmap",
                                              "munmap", "mremap"};
static uint64_t counts[N_COUNTERS];
static uint64_t alloc_bytes;

static __thread int in_lib __attribute__((tls_model("initial-exec")));
static int trace_fd = -1;
static long trace_skip;
static uint64_t trace_seq;
static int trace_lock;

static __attribute__((noinline)) void trace(int which, size_t size)
{
    if (__atomic_fetch_add(&trace_seq, 1, __ATOMIC_RELAXED) < (uint64_t)trace_skip) return;
    void *frames[48];
    int n = backtrace(frames, 48);
    char head[96];
    int hl = snprintf(head, sizeof head, "@ %s %zu\n", names[which], size);
    while (__atomic_exchange_n(&trace_lock, 1, __ATOMIC_ACQUIRE)) {
    }
    if (write(trace_fd, head, (size_t)hl) < 0) {
    }
    backtrace_symbols_fd(frames + 2, n > 2 ? n - 2 : 0, trace_fd);   /* not trace() nor count() */
    if (write(trace_fd, "\n", 1) < 0) {
    }
    __atomic_store_n(&trace_lock, 0, __ATOMIC_RELEASE);
}

/* Counts one call (not when the thread is already inside the library). */
static __attribute__((noinline)) void count(int which, size_t size)
{
    if (in_lib) return;
    __atomic_fetch_add(&counts[which], 1, __ATOMIC_RELAXED);
    if (which != C_FREE && which != C_MMAP && which != C_MUNMAP && which != C_MREMAP)
        __atomic_fetch_add(&alloc_bytes, (uint64_t)size, __ATOMIC_RELAXED);
    if (trace_fd >= 0) {
        in_lib = 1;
        trace(which, size);
        in_lib = 0;
    }
}

EXPORT void *malloc(size_t n)
{
    count(C_MALLOC, n);
    return __libc_malloc(n);
}

EXPORT void *calloc(size_t k, size_t n)
{
    count(C_CALLOC, k * n);
    return __libc_calloc(k, n);
}

EXPORT void *realloc(void *p, size_t n)
{
    count(C_REALLOC, n);
    return __libc_realloc(p, n);
}

EXPORT void *reallocarray(void *p, size_t k, size_t n)
{
    count(C_REALLOCARRAY, k * n);
    if (n && k > SIZE_MAX / n) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(p, k * n);
}

EXPORT void free(void *p)
{
    if (p) count(C_FREE, 0);
    __libc_free(p);
}

static int pow2(size_t a) { return a && !(a & (a - 1)); }

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    count(C_POSIX_MEMALIGN, n);
    if (!pow2(align) || align % sizeof(void *)) return EINVAL;
    int saved = errno;
    void *p = __libc_memalign(align, n);
    if (!p) {
        errno = saved;
        return ENOMEM;
    }
    *out = p;
    return 0;
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
    count(C_ALIGNED_ALLOC, n);
    if (!pow2(align)) {
        errno = EINVAL;
        return NULL;
    }
    return __libc_memalign(align, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
    count(C_MEMALIGN, n);
    return __libc_memalign(align, n);
}

EXPORT void *valloc(size_t n)
{
    count(C_VALLOC, n);
    return __libc_valloc(n);
}

EXPORT void *pvalloc(size_t n)
{
    count(C_PVALLOC, n);
    return __libc_pvalloc(n);
}

/* mmap family: the next definition, found once (dlsym may calloc: that is counted, harmlessly) */
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef int (*munmap_fn)(void *, size_t);
typedef void *(*mremap_fn)(void *, size_t, size_t, int, ...);
static mmap_fn next_mmap;
static munmap_fn next_munmap;
static mremap_fn next_mremap;

static void *next(const char *name, void **slot)
{
    void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!f) {
        int was = in_lib;
        in_lib = 1;
        f = dlsym(RTLD_NEXT, name);
        in_lib = was;
        __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    }
    return f;
}

EXPORT void *mmap(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
    count(C_MMAP, n);
    mmap_fn f = (mmap_fn)next("mmap", (void **)&next_mmap);
    if (!f) {
        errno = ENOSYS;
        return MAP_FAILED;
    }
    return f(a, n, prot, flags, fd, off);
}

EXPORT void *mmap64(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
    return mmap(a, n, prot, flags, fd, off);
}

EXPORT int munmap(void *a, size_t n)
{
    count(C_MUNMAP, 0);
    munmap_fn f = (munmap_fn)next("munmap", (void **)&next_munmap);
    if (!f) {
        errno = ENOSYS;
        return -1;
    }
    return f(a, n);
}

EXPORT void *mremap(void *a, size_t n, size_t m, int flags, ...)
{
    count(C_MREMAP, m);
    void *na = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        na = va_arg(ap, void *);
        va_end(ap);
    }
    mremap_fn f = (mremap_fn)next("mremap", (void **)&next_mremap);
    if (!f) {
        errno = ENOSYS;
        return MAP_FAILED;
    }
    return f(a, n, m, flags, na);
}

/* ---- setup and the report at exit ---- */

static char out_path[4096];

/* FILE with "%p" replaced by the pid (into out_path); 0 if there is no FILE. */
static int expand_path(const char *s)
{
    if (!s || !*s) return 0;
    size_t k = 0;
    for (; *s && k + 24 < sizeof out_path; s++) {
        if (s[0] == '%' && s[1] == 'p') {
            k += (size_t)snprintf(out_path + k, sizeof out_path - k, "%ld", (long)getpid());
            s++;
        } else {
            out_path[k++] = *s;
        }
    }
    out_path[k] = 0;
    return 1;
}

__attribute__((constructor)) static void k3_alloc_count_init(void)
{
    const char *t = getenv("K3_ALLOC_TRACE");
    if (t && *t) {
        const char *skip = getenv("K3_ALLOC_TRACE_SKIP");
        trace_skip = skip ? strtol(skip, NULL, 10) : 0;
        trace_fd = open(t, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    }
}

/* Runs at exit, after main returns and after the handlers the program
 * registered with atexit (the loader's handler was registered before them). */
__attribute__((destructor)) static void k3_alloc_count_report(void)
{
    in_lib = 1;
    if (!expand_path(getenv("K3_ALLOC_COUNT_OUT"))) return;
    char buf[2048];
    int k = snprintf(buf, sizeof buf, "{\"pid\": %ld", (long)getpid());
    uint64_t allocs = 0;
    for (int i = 0; i < N_COUNTERS; i++) {
        uint64_t c = __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
        if (i != C_FREE && i != C_MMAP && i != C_MUNMAP && i != C_MREMAP) allocs += c;
        k += snprintf(buf + k, sizeof buf - (size_t)k, ", \"%s\": %llu", names[i], (unsigned long long)c);
    }
    k += snprintf(buf + k, sizeof buf - (size_t)k, ", \"allocs\": %llu, \"alloc_bytes\": %llu}\n",
                  (unsigned long long)allocs, (unsigned long long)__atomic_load_n(&alloc_bytes, __ATOMIC_RELAXED));
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    for (int off = 0; off < k;) {
        ssize_t w = write(fd, buf + off, (size_t)(k - off));
        if (w <= 0) break;
        off += (int)w;
    }
    close(fd);
}
