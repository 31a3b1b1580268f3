/*
 * fuzz_expert_layout.c - libFuzzer target: the expert record layout. The input
 * is the header image of an expert shard (kind forced to "experts", header_hash
 * fixed up, file size as the header claims), decoded by k3_shard_decode: the
 * record parts (offsets from 0, 64-byte aligned, in order, no overlap), record
 * size, stride and count must then tile the file exactly (fz_check_shard).
 * An accepted layout is then described in a manifest the way k3pack writes it
 * (k3_manifest_describe_shard), dumped, and read back by k3_manifest_parse:
 * the layout the runtime reads must be the one the shard holds.
 */
#include "shard_check.h"

#include "k3_manifest.h"

#define MAX_RECORDS 4096   /* the round trip holds one hash per record */

static void round_trip(const k3_shard_header *h)
{
    if (h->n_records > MAX_RECORDS || h->layer >= (1u << 20) || h->n_entries > K3_MAX_RECORD_PARTS ||
        h->n_entries == 0)
        return;
    k3_manifest m;
    memset(&m, 0, sizeof m);
    m.format_version = K3_PACK_VERSION;
    m.config = json_object();
    m.experts_encoding = K3_ENC_MXFP4;
    m.n_shards = 1;
    m.shards = calloc(1, sizeof *m.shards);
    FZ_EXPECT(m.config && m.shards);
    m.shards[0].name = strdup("experts-fuzz.k3s");
    m.shards[0].kind = K3_SHARD_EXPERTS;
    m.shards[0].layer = h->layer;
    m.shards[0].size = h->file_size;
    uint64_t *hashes = malloc((h->n_records + 1) * sizeof *hashes);
    FZ_EXPECT(hashes && m.shards[0].name);
    for (uint64_t r = 0; r < h->n_records; r++) hashes[r] = r * 0x9e3779b97f4a7c15ull;
    k3_diag d = {0};
    k3_err e = k3_manifest_describe_shard(&m, 0, h, NULL, hashes, &d);
    if (e) {
        fz_check_err(e, &d);
        if (!m.n_expert_layers) free(hashes);
        k3_manifest_free(&m);
        return;
    }
    char *text = NULL;
    size_t len = 0;
    e = k3_manifest_dump(&m, &text, &len, &d);
    if (e) {
        fz_check_err(e, &d);
    } else {
        k3_manifest m2;
        e = k3_manifest_parse(text, len, "manifest.json", &m2, &d);
        if (e) {
            fprintf(stderr, "the manifest of a valid expert shard does not read back: %s\n", d.msg);
            abort();
        } else {
            FZ_EXPECT(m2.n_expert_layers == 1);
            const k3_mf_experts *x = &m.expert_layers[0], *y = &m2.expert_layers[0];
            FZ_EXPECT(y->layer == h->layer && y->count == h->n_records && y->offset == h->data_offset);
            FZ_EXPECT(y->stride == h->record_stride && y->record_size == h->record_size);
            FZ_EXPECT(y->n_parts == h->n_entries);
            for (uint32_t p = 0; p < y->n_parts; p++) {
                FZ_EXPECT(!strcmp(x->parts[p].name, y->parts[p].name));
                FZ_EXPECT(y->parts[p].encoding == h->entries[p].encoding && y->parts[p].ndim == h->entries[p].ndim);
                FZ_EXPECT(y->parts[p].offset == h->entries[p].offset && y->parts[p].size == h->entries[p].size);
                FZ_EXPECT(!memcmp(y->parts[p].shape, h->entries[p].shape, sizeof y->parts[p].shape));
            }
            for (uint64_t r = 0; r < y->count; r++) FZ_EXPECT(y->hashes[r] == x->hashes[r]);
            fz_accepted("expert layout, manifest round trip");
            k3_manifest_free(&m2);
        }
        free(text);
    }
    k3_manifest_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < K3_SHARD_FIXED_SIZE || size > (8u << 20)) return 0;
    uint8_t *b = malloc(size);
    FZ_EXPECT(b);
    memcpy(b, data, size);
    k3_st32(b + 16, K3_SHARD_EXPERTS);
    fz_fix_shard_hash(b, size);
    if (k3_ld64(b + 40) <= size) {
        uint64_t fs = k3_ld64(b + 48);
        k3_shard_header h;
        k3_diag d = {0};
        k3_err e = k3_shard_decode(b, size, fs, "experts.k3s", &h, &d);
        if (e) {
            fz_check_err(e, &d);
            FZ_EXPECT(e == K3_ERR_FORMAT || e == K3_ERR_CORRUPT || e == K3_ERR_UNSUPPORTED || e == K3_ERR_NOMEM);
        } else {
            FZ_EXPECT(h.kind == K3_SHARD_EXPERTS);
            fz_check_shard(&h, fs);
            round_trip(&h);
            k3_shard_header_free(&h);
        }
    }
    free(b);
    return 0;
}
