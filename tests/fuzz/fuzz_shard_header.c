/*
 * fuzz_shard_header.c - libFuzzer target: the input is the header image of a
 * k3 shard ([0, data_offset) of a .k3s file). Its header_hash is fixed up first
 * (shard_check.h) so mutations reach the layout rules instead of stopping at
 * the hash. Decoded twice: with the file size the header claims (the data
 * region is not part of the input), and through k3_shard_read_header on the
 * image as a whole file (a header that lies about its size). Accepted headers
 * must satisfy fz_check_shard; rejections must be clean.
 */
#include "shard_check.h"

static void check_rejection(k3_err e, const k3_diag *d)
{
    fz_check_err(e, d);
    FZ_EXPECT(e == K3_ERR_FORMAT || e == K3_ERR_CORRUPT || e == K3_ERR_UNSUPPORTED || e == K3_ERR_NOMEM);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (8u << 20)) return 0;
    uint8_t *b = malloc(size ? size : 1);
    FZ_EXPECT(b);
    memcpy(b, data, size);
    fz_fix_shard_hash(b, size);
    k3_shard_header h;
    k3_diag d = {0};
    k3_err e;

    /* 1. the header image with the size its header claims */
    if (size >= K3_SHARD_FIXED_SIZE && k3_ld64(b + 40) <= size) {
        uint64_t fs = k3_ld64(b + 48);
        e = k3_shard_decode(b, size, fs, "fuzz.k3s", &h, &d);
        if (e) {
            check_rejection(e, &d);
        } else {
            fz_check_shard(&h, fs);
            fz_accepted("header image");
            for (uint32_t i = 0; i < h.n_entries; i++) {
                char name[K3_SHARD_MAX_NAME + 1];
                memcpy(name, h.entries[i].name, h.entries[i].name_len);
                name[h.entries[i].name_len] = '\0';
                if (strlen(name) == h.entries[i].name_len)   /* a NUL in a name hides the rest */
                    FZ_EXPECT(k3_shard_find(&h, name) != NULL);
            }
            k3_shard_header_free(&h);
        }
    }

    /* 2. the image as a whole file, read as the tools read it */
    int fd = open(fz_file(0, b, size), O_RDONLY);
    FZ_EXPECT(fd >= 0);
    e = k3_shard_read_header(fd, "fuzz.k3s", &h, &d);
    close(fd);
    if (e) {
        check_rejection(e, &d);
    } else {
        fz_check_shard(&h, size);
        fz_accepted("shard file");
        k3_shard_header_free(&h);
    }
    free(b);
    return 0;
}
