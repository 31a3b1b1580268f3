/*
 * fuzz_safetensors_header.c - libFuzzer target: the input is a whole
 * safetensors file image, given to k3_st_parse_header with file_size = size.
 * A success must satisfy every invariant the reader promises (sorted,
 * contiguous extents covering the data region exactly, sizes consistent, clean
 * names); a failure must be a K3_ERR_FORMAT naming the file. Anything else aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

#define EXPECT(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s\n", #c); abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    k3_st_header h;
    k3_diag d;
    memset(&d, 0, sizeof d);
    k3_err e = k3_st_parse_header(data, size, size, "fuzz", &h, &d);
    if (e) {
        EXPECT(e == K3_ERR_FORMAT || e == K3_ERR_NOMEM);
        EXPECT(d.code == e && strncmp(d.msg, "'fuzz': ", 8) == 0);
        EXPECT(strlen(d.msg) < sizeof d.msg);
        EXPECT(h.tensors == NULL && h.n_tensors == 0 && h.pool == NULL);
        return 0;
    }
    EXPECT(h.data_start == h.header_len + 8 && h.data_start <= size && h.file_size == size);
    uint64_t pos = 0;
    for (size_t i = 0; i < h.n_tensors; i++) {
        const k3_st_tensor *t = &h.tensors[i];
        EXPECT(t->name_len > 0 && strlen(t->name) == t->name_len);
        EXPECT(t->dtype < K3_DT__COUNT && t->rank <= K3_ST_MAX_RANK);
        uint64_t numel = 1;
        for (unsigned k = 0; k < t->rank; k++) numel *= t->shape[k];   /* validated: no overflow */
        EXPECT(numel == t->numel);
        EXPECT(numel * k3_dtype_bits((k3_dtype)t->dtype) == t->nbytes * 8);
        EXPECT(t->begin == pos);                         /* contiguous from 0, sorted */
        EXPECT(t->offset == h.data_start + t->begin);
        EXPECT(t->offset + t->nbytes <= size);
        if (i) EXPECT(strcmp(h.tensors[i - 1].name, t->name) != 0 || t->nbytes != h.tensors[i - 1].nbytes);
        pos += t->nbytes;
    }
    EXPECT(h.data_start + pos == size);                  /* no trailing bytes */
    for (size_t i = 0; i < h.n_meta; i++) EXPECT(h.meta[i].key && h.meta[i].value);
    k3_st_header_free(&h);
    return 0;
}
