/* shard.c: what a table is (its config, the checks on it, a push's row width) and where its
 * parts live: a sparse key's shard, a dense element's shard, and which server owns a shard
 * (rendezvous hashing: each shard goes to the server whose (name, shard) hash is highest, so
 * removing a server moves only its own shards and adding one takes about 1/(S+1) from the
 * others). */
#include <math.h>
#include <string.h>

#include "internal.h"

void edl_ps_table_config_init(edl_ps_table_config *cfg)
{
    *cfg = (edl_ps_table_config){.kind = EDL_PS_SPARSE, .dim = 8, .size = 0,
                                 .shards = EDL_PS_DEFAULT_SHARDS, .optimizer = EDL_PS_SGD,
                                 .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                 .init = EDL_PS_INIT_UNIFORM, .init_scale = 0.01f, .seed = 0,
                                 .accessor = EDL_PS_ACCESSOR_PLAIN, .replicas = 1,
                                 .ctr = {.nonclk_coeff = 0.1f, .click_coeff = 1,
                                         .embedx_threshold = 10,
                                         .show_click_decay_rate = 0.98f,
                                         .delete_threshold = 0.8f,
                                         .delete_after_unseen_days = 30}};
}

uint32_t ps_push_width(const edl_ps_table_config *c)
{
    return c->dim + (c->accessor == EDL_PS_ACCESSOR_CTR ? 2 : 0);
}

static bool finite_in(float v, float lo, float hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

/* The CTR accessor's fields (a plain table ignores them). */
static int ctr_check(const edl_ps_table_config *c, char *why, size_t whylen)
{
    const edl_ps_ctr_config *k = &c->ctr;
    if (c->accessor != EDL_PS_ACCESSOR_CTR)
        return edl_errf(why, whylen, EDL_EINVAL, "accessor %d (plain 0, ctr 1)", c->accessor);
    if (c->kind != EDL_PS_SPARSE || c->dim < 2 || c->geo_trainers)
        return edl_errf(why, whylen, EDL_EINVAL, "the ctr accessor needs a sparse table of dim "
                        ">= 2 (embed_w and embedx) without geo_trainers (kind %d, dim %u, "
                        "geo_trainers %u)", c->kind, c->dim, c->geo_trainers);
    if (!finite_in(k->nonclk_coeff, 0, 1e6f) || !finite_in(k->click_coeff, 0, 1e6f))
        return edl_errf(why, whylen, EDL_EINVAL, "ctr.nonclk_coeff %g, ctr.click_coeff %g: "
                        "finite, in [0, 1e6]", (double)k->nonclk_coeff, (double)k->click_coeff);
    if (!finite_in(k->embedx_threshold, 0, 1e30f))
        return edl_errf(why, whylen, EDL_EINVAL, "ctr.embedx_threshold %g: finite and >= 0",
                        (double)k->embedx_threshold);
    if (!finite_in(k->show_click_decay_rate, 0, 1))
        return edl_errf(why, whylen, EDL_EINVAL, "ctr.show_click_decay_rate %g: in [0, 1]",
                        (double)k->show_click_decay_rate);
    if (!finite_in(k->delete_threshold, 0, 1e30f))
        return edl_errf(why, whylen, EDL_EINVAL, "ctr.delete_threshold %g: finite and >= 0",
                        (double)k->delete_threshold);
    if (k->delete_after_unseen_days < 1 || k->delete_after_unseen_days > PS_CTR_MAX_UNSEEN)
        return edl_errf(why, whylen, EDL_EINVAL, "ctr.delete_after_unseen_days %u (1..%u)",
                        k->delete_after_unseen_days, PS_CTR_MAX_UNSEEN);
    return 0;
}

int edl_ps_table_config_check(const edl_ps_table_config *c, char *why, size_t whylen)
{
    if (c->kind != EDL_PS_DENSE && c->kind != EDL_PS_SPARSE)
        return edl_errf(why, whylen, EDL_EINVAL, "table kind %d (dense 1, sparse 2)", c->kind);
    if (c->kind == EDL_PS_SPARSE && (c->dim < 1 || c->dim > EDL_PS_MAX_DIM || c->size != 0))
        return edl_errf(why, whylen, EDL_EINVAL, "a sparse table needs dim 1..%d and size 0 "
                        "(dim %u, size %llu)", EDL_PS_MAX_DIM, c->dim,
                        (unsigned long long)c->size);
    if (c->kind == EDL_PS_DENSE && (c->dim != 1 || c->size < 1 || c->size > EDL_PS_MAX_DENSE))
        return edl_errf(why, whylen, EDL_EINVAL, "a dense table needs size 1..%u and dim 1 "
                        "(size %llu, dim %u)", EDL_PS_MAX_DENSE, (unsigned long long)c->size,
                        c->dim);
    if (c->shards < 1 || c->shards > EDL_PS_MAX_SHARDS)
        return edl_errf(why, whylen, EDL_EINVAL, "shards %u (1..%d)", c->shards,
                        EDL_PS_MAX_SHARDS);
    if (c->optimizer < EDL_PS_SGD || c->optimizer > EDL_PS_ADAM)
        return edl_errf(why, whylen, EDL_EINVAL, "optimizer %d (sgd 1, adagrad 2, adam 3)",
                        c->optimizer);
    if (!finite_in(c->lr, 0, 1e6f) || !finite_in(c->beta1, 0, 0.999999f) ||
        !finite_in(c->beta2, 0, 0.999999f) || !finite_in(c->eps, 0, 1))
        return edl_errf(why, whylen, EDL_EINVAL, "lr %g, beta1 %g, beta2 %g, eps %g: lr must "
                        "be finite and >= 0, betas in [0, 1), eps in [0, 1]", (double)c->lr,
                        (double)c->beta1, (double)c->beta2, (double)c->eps);
    if ((c->init != EDL_PS_INIT_ZERO && c->init != EDL_PS_INIT_UNIFORM) ||
        !finite_in(c->init_scale, 0, 1e6f))
        return edl_errf(why, whylen, EDL_EINVAL, "init %d with scale %g (zero 1, uniform 2; "
                        "scale finite and >= 0)", c->init, (double)c->init_scale);
    if (c->geo_trainers > EDL_PS_MAX_GEO_TRAINERS ||
        (c->geo_trainers && c->kind != EDL_PS_SPARSE))
        return edl_errf(why, whylen, EDL_EINVAL, "geo_trainers %u: 0, or 1..%d on a sparse "
                        "table", c->geo_trainers, EDL_PS_MAX_GEO_TRAINERS);
    if (c->replicas < 1 || c->replicas > EDL_PS_MAX_REPLICAS)
        return edl_errf(why, whylen, EDL_EINVAL, "replicas %u (1..%d)", c->replicas,
                        EDL_PS_MAX_REPLICAS);
    return c->accessor == EDL_PS_ACCESSOR_PLAIN ? 0 : ctr_check(c, why, whylen);
}

uint32_t edl_ps_key_shard(uint64_t key, uint32_t shards)
{
    return ps_hash_shard(ps_mix64(key), shards);
}

/* Shards 0..r-1 hold q+1 elements, the others q (q = size / shards, r = size % shards). */
uint64_t edl_ps_dense_shard_start(uint64_t size, uint32_t shards, uint32_t s)
{
    uint64_t q = size / shards, r = size % shards;
    return q * s + (s < r ? s : r);
}

uint64_t edl_ps_dense_shard_len(uint64_t size, uint32_t shards, uint32_t s)
{
    return size / shards + (s < size % shards);
}

uint32_t edl_ps_dense_shard(uint64_t index, uint64_t size, uint32_t shards)
{
    uint64_t q = size / shards, r = size % shards;
    if (index < r * (q + 1))
        return (uint32_t)(index / (q + 1));
    return (uint32_t)(r + (index - r * (q + 1)) / q);
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then mixed */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return ps_mix64(h);
}

/* Server i's weight for shard s: the highest weights own it (ties: the smaller name). */
static uint64_t weight(const char *name, uint32_t s)
{
    return ps_mix64(name_hash(name) ^ ps_mix64(s + 0x9e3779b97f4a7c15ull));
}

static bool heavier(const char *const *names, int i, uint64_t wi, int j, uint64_t wj)
{
    return wi > wj || (wi == wj && strcmp(names[i], names[j]) < 0);
}

int edl_ps_shard_owner(const char *const *names, int n, uint32_t s)
{
    int best = 0;
    uint64_t top = weight(names[0], s);
    for (int i = 1; i < n; i++) {
        uint64_t w = weight(names[i], s);
        if (heavier(names, i, w, best, top))
            top = w, best = i;
    }
    return best;
}

int edl_ps_shard_replicas(const char *const *names, int n, uint32_t s, int r, int *out)
{
    uint64_t w[EDL_PS_MAX_REPLICAS];
    int k = 0;
    for (int i = 0; i < n; i++) { /* insertion into the r heaviest so far */
        uint64_t wi = weight(names[i], s);
        int at = k;
        while (at > 0 && heavier(names, i, wi, out[at - 1], w[at - 1]))
            at--;
        if (at >= r)
            continue;
        for (int j = (k < r ? k : r - 1); j > at; j--)
            out[j] = out[j - 1], w[j] = w[j - 1];
        out[at] = i, w[at] = wi;
        k += k < r;
    }
    return k;
}
