/*
 * k3_checked.h - checked 64-bit size arithmetic and little-endian loads and
 * stores through memcpy (never a typed pointer into possibly unaligned data).
 * Each checked op returns 1 on overflow and leaves *out unspecified.
 */
#ifndef K3_CHECKED_H
#define K3_CHECKED_H

#include <stdint.h>
#include <string.h>

static inline int k3_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out);
}

static inline int k3_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

/* Round x up to a multiple of align (a power of two). Returns 1 on overflow. */
static inline int k3_align_up_u64(uint64_t x, uint64_t align, uint64_t *out)
{
    uint64_t t;
    if (k3_add_u64(x, align - 1, &t)) return 1;
    *out = t & ~(align - 1);
    return 0;
}

static inline uint16_t k3_ld16(const void *p) { const uint8_t *b = p; return (uint16_t)(b[0] | b[1] << 8); }
static inline uint32_t k3_ld32(const void *p)
{
    const uint8_t *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline uint64_t k3_ld64(const void *p)
{
    const uint8_t *b = p;
    return (uint64_t)k3_ld32(b) | (uint64_t)k3_ld32(b + 4) << 32;
}
static inline void k3_st16(void *p, uint16_t v) { uint8_t *b = p; b[0] = (uint8_t)v; b[1] = (uint8_t)(v >> 8); }
static inline void k3_st32(void *p, uint32_t v)
{
    uint8_t *b = p;
    b[0] = (uint8_t)v; b[1] = (uint8_t)(v >> 8); b[2] = (uint8_t)(v >> 16); b[3] = (uint8_t)(v >> 24);
}
static inline void k3_st64(void *p, uint64_t v) { k3_st32(p, (uint32_t)v); k3_st32((uint8_t *)p + 4, (uint32_t)(v >> 32)); }

#endif
