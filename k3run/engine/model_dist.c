/*
 * model_dist.c - the routed experts across MPI ranks (dist.h), the engine's
 * side: rank 0 sends each MoE layer's work out and collects the outputs of
 * the experts other ranks own; every other rank serves that work until rank
 * 0 says stop (k3_model_serve_experts, model.h).
 *
 * Per MoE layer and forward pass (T tokens, k experts each, latent width Dl):
 *   1. broadcast from rank 0: a header {op, layer, T}, then idx [T][k] int32
 *      and the experts' input xl [T][Dl] fp32;
 *   2. every rank computes the slots (t, j) whose expert it owns
 *      (k3_moe_experts: the same code, kernels and canonical order as one
 *      process, whatever the rank, thread count or ISA);
 *   3. each other rank sends rank 0 a status {code, message} and then its
 *      slots' rows of Y in (t, j) order; rank 0 puts them in Y.
 * Rank 0 then weighs and sums Y in slot order exactly as in one process, so
 * the text does not depend on the rank count. (The trunk's split matrices
 * have their own exchange, model_split.c; this loop serves both.) Bytes per layer: rank 0 sends
 * 12 + 4 T k + 4 T Dl to each rank and receives 4 Dl per slot another rank
 * owns, plus 260 per rank.
 */
#include "model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static k3_err rows_buffer(k3_model *m, k3_diag *d)
{
    if (m->dist_rows) return K3_OK;
    size_t n = (size_t)m->o.max_batch * m->d.k * m->d.Dl;
    if (!(m->dist_rows = malloc((n ? n : 1) * sizeof(float))))
        return k3_fail(d, K3_ERR_NOMEM, "out of memory for the experts' exchange between ranks");
    return K3_OK;
}

k3_err k3_dist_moe_send(k3_model *m, int layer, uint32_t T, const float *xl, k3_diag *d)
{
    const k3_dims *z = &m->d;
    uint32_t hdr[3] = {OP_MOE, (uint32_t)layer, T};
    k3_err e = rows_buffer(m, d);
    if (!e) e = k3_dist_bcast(hdr, sizeof hdr, d);
    if (!e) e = k3_dist_bcast(m->idx, (size_t)T * z->k * sizeof(int32_t), d);
    if (!e) e = k3_dist_bcast((void *)xl, (size_t)T * z->Dl * sizeof(float), d);
    return e;
}

k3_err k3_dist_moe_collect(k3_model *m, uint32_t T, k3_diag *d)
{
    const k3_dims *z = &m->d;
    const int R = k3_dist_size();
    const size_t Dl = z->Dl, n = (size_t)T * z->k;
    k3_err first = K3_OK;
    for (int r = 1; r < R; r++) {                   /* every rank's answer, even after an error */
        dist_status st;
        k3_err e = k3_dist_recv(r, TAG_STATUS, &st, sizeof st, d);
        if (e) return e;
        if (st.code != K3_OK) {
            st.msg[sizeof st.msg - 1] = 0;
            if (!first) first = k3_fail(d, (k3_err)st.code, "rank %d of %d: %s", r, R, st.msg);
            continue;
        }
        size_t own = 0;
        for (size_t i = 0; i < n; i++) own += k3_dist_owner((uint32_t)m->idx[i]) == r;
        if ((e = k3_dist_recv(r, TAG_ROWS, m->dist_rows, own * Dl * sizeof(float), d))) return e;
        for (size_t i = 0, o = 0; i < n; i++)
            if (k3_dist_owner((uint32_t)m->idx[i]) == r)
                memcpy(m->Y + i * Dl, m->dist_rows + o++ * Dl, Dl * sizeof(float));
    }
    return first;
}

void k3_model_dist_stop(k3_model *m)
{
    (void)m;
    if (k3_dist_size() <= 1 || k3_dist_rank() != 0) return;
    uint32_t hdr[3] = {OP_STOP, 0, 0};
    k3_diag d;
    if (k3_dist_bcast(hdr, sizeof hdr, &d)) fprintf(stderr, "k3run: rank 0: %s\n", d.msg);
}

k3_err k3_model_serve_experts(k3_model *m, k3_diag *d)
{
    const k3_dims *z = &m->d;
    const int me = k3_dist_rank();
    k3_err e = rows_buffer(m, d);
    if (e) return e;
    for (;;) {
        uint32_t hdr[3];
        if ((e = k3_dist_bcast(hdr, sizeof hdr, d))) return e;
        if (hdr[0] == OP_STOP) return K3_OK;
        if ((hdr[0] & 0xf) == OP_LIN) {                /* model_split.c */
            if ((e = k3_dist_serve_lin(m, hdr, d))) return e;
            continue;
        }
        uint32_t layer = hdr[1], T = hdr[2];
        if (hdr[0] != OP_MOE || T == 0 || T > m->o.max_batch || layer >= z->L)
            return k3_fail(d, K3_ERR_INTERNAL, "rank %d: a message from rank 0 makes no sense (op %u, layer %u, "
                           "%u tokens): the ranks run different k3run builds or options", me, hdr[0], layer, T);
        const size_t Dl = z->Dl, n = (size_t)T * z->k;
        if ((e = k3_dist_bcast(m->idx, n * sizeof(int32_t), d))) return e;
        if ((e = k3_dist_bcast(m->xl, (size_t)T * Dl * sizeof(float), d))) return e;
        dist_status st;
        memset(&st, 0, sizeof st);
        k3_diag pd = {0};
        k3_err pe = K3_OK;
        for (size_t i = 0; i < n && !pe; i++)
            if (m->idx[i] < 0 || (uint32_t)m->idx[i] >= z->E)
                pe = k3_fail(&pd, K3_ERR_INTERNAL, "expert %d of layer %u is outside 0..%u", (int)m->idx[i], layer,
                             z->E - 1);
        if (!pe) pe = k3_moe_experts(m, (int)layer, T, m->xl, &pd);
        st.code = pe;
        if (pe) snprintf(st.msg, sizeof st.msg, "%.255s", pd.msg);
        if ((e = k3_dist_send(0, TAG_STATUS, &st, sizeof st, d))) return e;
        if (pe) continue;                           /* rank 0 reports it and stops us */
        size_t o = 0;
        for (size_t i = 0; i < n; i++)
            if (k3_dist_owner((uint32_t)m->idx[i]) == me)
                memcpy(m->dist_rows + o++ * Dl, m->Y + i * Dl, Dl * sizeof(float));
        if ((e = k3_dist_send(0, TAG_ROWS, m->dist_rows, o * Dl * sizeof(float), d))) return e;
    }
}
