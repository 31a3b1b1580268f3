/*
 * dump.h - a debugging record of every intermediate the model reports
 * (model.h dump hook), written as one safetensors file in the layout of
 * tests/reference's `k3ref.py --dump` (tests/reference/README.md "Dump
 * format"), so the C engine and the reference compare tensor by tensor.
 * For tests and debugging only: it allocates as it records.
 */
#ifndef K3_DUMP_H
#define K3_DUMP_H

#include <stdint.h>

#include "k3_error.h"

typedef struct k3_dump k3_dump;

k3_dump *k3_dump_new(void);
/* The model.h hook (ctx = the k3_dump). */
void k3_dump_hook(void *ctx, const char *name, int layer, uint32_t T, uint32_t width, const float *f,
                  const int32_t *ids);
/* Record the processed ids (the dump's "ids" tensor). */
void k3_dump_ids(k3_dump *dp, const int32_t *ids, uint32_t n);
k3_err k3_dump_write(k3_dump *dp, const char *path, k3_diag *d);
void k3_dump_free(k3_dump *dp);

#endif
