/*
 * model_experts.c - the routed experts of a MoE layer that this process
 * computes (model_ffn.c routes, weighs and sums; with several MPI ranks each
 * computes its own share here, model_dist.c moves the rest). A batch reads
 * each chosen expert once: the batch's experts are acquired together, and
 * each expert multiplies all the tokens that chose it at once; one token's
 * experts run as waves in one parallel region.
 */
#include "model_impl.h"

#include <omp.h>
#include <string.h>

/*
 * Experts ex[wl[0..nw)] of a one-token step, all in one parallel region: the gate and up rows
 * of all of them as one list of 32-row blocks, then their GLU, then the down rows into the
 * slots ws[] of Y. Each output element is one row's dot product in the canonical order and
 * the GLU is element-wise, so how the lists are split between threads changes no bit; one
 * region instead of three (or five, with the GLU) per expert. xl [Dl]; g, u [nw][Ie].
 */
static void experts_wave(k3_model *m, const float *xl, const int32_t *wl, const int32_t *ws, int nw)
{
    const k3_dims *z = &m->d;
    const uint32_t Ie = z->Ie, Dl = z->Dl, BR = K3_KERN_BLOCK;
    const long nb1 = (long)((Ie + BR - 1) / BR), nb2 = (long)((Dl + BR - 1) / BR);
    const long n1 = 2L * nw * nb1, n2 = (long)nw * nb2, ng = (long)(((size_t)nw * Ie + 511) / 512);
    float *G = m->g, *U = m->u, *Y = m->Y;
    const k3_expert *ex = m->ex;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (long i = 0; i < n1; i++) {
            long e = i / (2 * nb1), r = i % (2 * nb1), blk = r % nb1;
            const k3_mat *W = r < nb1 ? &ex[wl[e]].w1 : &ex[wl[e]].w3;
            float *y = (r < nb1 ? G : U) + (size_t)e * Ie;
            uint32_t r0 = (uint32_t)blk * BR, r1 = Ie - r0 < BR ? Ie : r0 + BR;
            k3_matmul_rows(m->o.isa, W, xl, Dl, 1, y, Ie, r0, r1);
        }
#pragma omp for schedule(static)
        for (long j = 0; j < ng; j++) {
            size_t i0 = (size_t)j * 512, n = (size_t)nw * Ie - i0 < 512 ? (size_t)nw * Ie - i0 : 512;
            k3_glu_part(m, G + i0, U + i0, n);
        }
#pragma omp for schedule(static)
        for (long i = 0; i < n2; i++) {
            long e = i / nb2, blk = i % nb2;
            uint32_t r0 = (uint32_t)blk * BR, r1 = Dl - r0 < BR ? Dl : r0 + BR;
            k3_matmul_rows(m->o.isa, &ex[wl[e]].w2, G + (size_t)e * Ie, Ie, 1, Y + (size_t)ws[e] * Dl, Dl,
                           r0, r1);
        }
    }
}

/*
 * A wave of a batch's experts, all in one parallel region (the batch form of experts_wave): expert
 * ex[wl[i]] multiplies the wn[i] rows of xe from row wo[i] (the tokens that chose it, gathered),
 * i < nw, rows in all. The gate and up rows of all of them as one list of 32-row blocks, the GLU,
 * then the down rows into ye; x is packed once for the whole wave (k3_xpack), and once more after
 * the GLU. Each output element is one row's dot product in the canonical order, whatever the
 * rows beside it, so this changes no bit. xe, ye [rows][Dl]; g, u [rows][Ie].
 */
#define WAVE_MAX 64                               /* experts per wave */
typedef struct wave {
    k3_model *m;
    const int32_t *wl;                            /* [nw] ex index */
    const uint32_t *wo, *wn;                      /* [nw] first row, rows */
    uint32_t rows, Ie, Dl;
    long nb1, nb2;                                /* 32-row blocks of gate/up, of down */
    size_t pcx, pcg;                              /* floats per packed row of x, of G */
    int px, pg;                                   /* x packed, G to be packed */
} wave;

static void wave_gate_up(const wave *v, long i)   /* item i of 2 nw nb1 */
{
    k3_model *m = v->m;
    long e = i / (2 * v->nb1), r = i % (2 * v->nb1), blk = r % v->nb1;
    const k3_mat *W = r < v->nb1 ? &m->ex[v->wl[e]].w1 : &m->ex[v->wl[e]].w3;
    float *y = (r < v->nb1 ? m->g : m->u) + (size_t)v->wo[e] * v->Ie;
    uint32_t r0 = (uint32_t)blk * K3_KERN_BLOCK, r1 = v->Ie - r0 < K3_KERN_BLOCK ? v->Ie : r0 + K3_KERN_BLOCK;
    k3_matmul_rows_xp(m->o.isa, W, m->xe + (size_t)v->wo[e] * v->Dl, v->Dl,
                      v->px ? m->xpk + v->wo[e] * v->pcx : NULL, v->wn[e], y, v->Ie, r0, r1);
}

static void wave_glu(const wave *v, long j)       /* item j of the 512-element chunks of G */
{
    size_t i0 = (size_t)j * 512, all = (size_t)v->rows * v->Ie, n = all - i0 < 512 ? all - i0 : 512;
    k3_glu_part(v->m, v->m->g + i0, v->m->u + i0, n);
}

static void wave_pack(const wave *v, long r)      /* row r of G into xpk */
{
    if (v->pg) k3_xpack(v->m->o.isa, v->m->g + (size_t)r * v->Ie, v->Ie, 1, v->Ie, v->m->xpk + r * v->pcg);
}

static void wave_down(const wave *v, long i)      /* item i of nw nb2 */
{
    k3_model *m = v->m;
    long e = i / v->nb2, blk = i % v->nb2;
    uint32_t r0 = (uint32_t)blk * K3_KERN_BLOCK, r1 = v->Dl - r0 < K3_KERN_BLOCK ? v->Dl : r0 + K3_KERN_BLOCK;
    k3_matmul_rows_xp(m->o.isa, &m->ex[v->wl[e]].w2, m->g + (size_t)v->wo[e] * v->Ie, v->Ie,
                      v->pg ? m->xpk + v->wo[e] * v->pcg : NULL, v->wn[e], m->ye + (size_t)v->wo[e] * v->Dl, v->Dl,
                      r0, r1);
}

static void experts_batch_wave(k3_model *m, const int32_t *wl, const uint32_t *wo, const uint32_t *wn, int nw,
                               uint32_t rows)
{
    const k3_dims *z = &m->d;
    wave v = {.m = m, .wl = wl, .wo = wo, .wn = wn, .rows = rows, .Ie = z->Ie, .Dl = z->Dl,
              .nb1 = (long)((z->Ie + K3_KERN_BLOCK - 1) / K3_KERN_BLOCK),
              .nb2 = (long)((z->Dl + K3_KERN_BLOCK - 1) / K3_KERN_BLOCK),
              .pcx = k3_xpack_cols(z->Dl), .pcg = k3_xpack_cols(z->Ie)};
    const long n1 = 2L * nw * v.nb1, n2 = (long)nw * v.nb2, ng = (long)(((size_t)rows * v.Ie + 511) / 512);
    /* x packed (xpk [rows][pcx]), then G packed (xpk [rows][pcg]) once x's products are done */
    v.px = (uint64_t)rows * v.pcx <= m->xpk_cap && k3_xpack(m->o.isa, m->xe, v.Dl, rows, v.Dl, m->xpk);
    v.pg = (uint64_t)rows * v.pcg <= m->xpk_cap && k3_xpack_used(m->o.isa, v.Ie);
    if (omp_get_max_threads() > 1) {
#pragma omp parallel
        {
#pragma omp for schedule(dynamic, 1)
            for (long i = 0; i < n1; i++) wave_gate_up(&v, i);
#pragma omp for schedule(static)
            for (long j = 0; j < ng; j++) wave_glu(&v, j);
#pragma omp for schedule(static)
            for (long r = 0; r < (long)rows; r++) wave_pack(&v, r);
#pragma omp for schedule(dynamic, 1)
            for (long i = 0; i < n2; i++) wave_down(&v, i);
        }
    } else {                      /* one thread: no region (libgomp allocates a team for each) */
        for (long i = 0; i < n1; i++) wave_gate_up(&v, i);
        for (long j = 0; j < ng; j++) wave_glu(&v, j);
        for (long r = 0; r < (long)rows; r++) wave_pack(&v, r);
        for (long i = 0; i < n2; i++) wave_down(&v, i);
    }
    for (uint32_t r = 0; r < rows; r++)
        memcpy(m->Y + ((size_t)m->tok_of[r] * z->k + m->slot_of[r]) * v.Dl, m->ye + (size_t)r * v.Dl,
               v.Dl * sizeof(float));
}

/*
 * The routed experts of the batch that this rank owns (dist.h: all of them in one process): each
 * chosen slot (t, j) of m->idx [T][k] whose expert e has k3_dist_owner(e) == this rank gets its
 * expert's output in Y[t][j] [Dl]. xl [T][Dl] is the experts' input.
 */
k3_err k3_moe_experts(k3_model *m, int layer, uint32_t T, const float *xl, k3_diag *d)
{
    const k3_dims *z = &m->d;
    k3_weights *w = m->w;
    const uint32_t E = z->E, k = z->k, Dl = z->Dl;
    const int me = k3_dist_rank();
    /* the batch's experts, ascending, acquired together */
    uint32_t nu = 0;
    memset(m->seen, 0, E * sizeof *m->seen);
    for (uint32_t i = 0; i < T * k; i++) m->seen[m->idx[i]]++;
    for (uint32_t e = 0; e < E; e++)                                  /* this rank's only */
        if (m->seen[e] && k3_dist_owner(e) == me) m->uniq[nu++] = (int32_t)e;
    /* in groups the expert cache can hold at once (all of them when resident) */
    uint32_t cap = k3w_expert_capacity(w);
    int waves = T == 1 && omp_get_max_threads() > 1;
    for (uint32_t g0 = 0; g0 < nu; g0 += cap) {
        uint32_t gn = nu - g0 < cap ? nu - g0 : cap;
        k3_err err = k3w_experts_acquire(w, layer, m->uniq + g0, m->seen, (int)gn, m->ex, d);
        if (err) return err;
        while (waves) {                   /* one token: the experts at hand in one parallel region */
            int nr = k3w_experts_ready(w), nw = 0;
            int32_t *wl = m->tok_of, *ws = m->slot_of;                   /* [k] ex index, slot */
            do {
                int uj;
                if ((err = k3w_experts_next(w, &uj, d))) return err;
                if (uj < 0) break;
                int32_t e = m->uniq[g0 + (uint32_t)uj];
                uint32_t j = 0;
                while (m->idx[j] != e) j++;                               /* its slot (one token) */
                wl[nw] = uj;
                ws[nw++] = (int32_t)j;
            } while (nw < nr);
            if (!nw) break;
            experts_wave(m, xl, wl, ws, nw);
        }
        /* a batch: the experts at hand in waves of one parallel region each, at most WAVE_MAX
           experts and T rows (xe) per wave */
        int32_t wl[WAVE_MAX];                                         /* ex index of each */
        uint32_t wo[WAVE_MAX], wn[WAVE_MAX], rows = 0;                /* first row, rows */
        int nw = 0;
        while (!waves) {
            int nr = k3w_experts_ready(w), got = 0, uj;
            do {                                                      /* at least one (may wait) */
                if ((err = k3w_experts_next(w, &uj, d))) return err;
                if (uj < 0) break;
                int32_t e = m->uniq[g0 + (uint32_t)uj];
                if (nw == WAVE_MAX || rows + m->seen[e] > T) {        /* full: compute it first */
                    experts_batch_wave(m, wl, wo, wn, nw, rows);
                    nw = 0;
                    rows = 0;
                }
                wl[nw] = uj;
                wo[nw] = rows;
                for (uint32_t t = 0; t < T; t++)                      /* the tokens that chose e */
                    for (uint32_t j = 0; j < k; j++)
                        if (m->idx[(size_t)t * k + j] == e) {
                            memcpy(m->xe + (size_t)rows * Dl, xl + (size_t)t * Dl, Dl * sizeof(float));
                            m->tok_of[rows] = (int32_t)t;
                            m->slot_of[rows] = (int32_t)j;
                            rows++;
                        }
                wn[nw] = rows - wo[nw];
                nw++;
            } while (++got < nr);
            if (nw) experts_batch_wave(m, wl, wo, wn, nw, rows);      /* what is at hand now */
            nw = 0;
            rows = 0;
            if (uj < 0) break;
        }
        k3w_experts_release(w, layer);
    }
    return K3_OK;
}

