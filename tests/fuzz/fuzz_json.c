/*
 * fuzz_json.c - libFuzzer target: k3_json against jansson on the raw input
 * (json_diff.h). Any document the two parse differently aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "json_diff.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[512];
    if (k3_json_diff(data, size, why, sizeof why)) {
        fprintf(stderr, "k3_json and jansson disagree: %s\n", why);
        abort();
    }
    return 0;
}
