/* dedup.c: what a shard remembers of its clients' pushes, so that a push sent again (a retry,
 * a replica's copy) is applied once: per client (its token) the last push applied (its seq)
 * and the request it came in (req: numbered over the server's life, so also when the client
 * last pushed). The entries are an open-addressing hash by token, at most half full, so a
 * client is found in one cache line however many a long job has seen (each restarted trainer
 * is a new client, and every shard it pushed to keeps it); past PS_DEDUP_MAX clients the one
 * that pushed least recently is forgotten (by `used`: the last request, or for entries taken
 * from a shard's bytes their place there, so that the bytes export back as they came). A slot
 * whose seq is 0 is empty (clients number their pushes from 1). */
#include <stdlib.h>
#include <string.h>

#include "edl/common.h"
#include "edl/wire.h"
#include "internal.h"

static uint32_t home(uint64_t token, uint32_t cap)
{
    return (uint32_t)(ps_mix64(token) & (cap - 1));
}

/* The slot of token's entry, or the empty slot where it would go (d->cap > 0). */
static uint32_t find(const ps_dedup *d, uint64_t token)
{
    uint32_t i = home(token, d->cap);
    while (d->slot[i].seq && d->slot[i].token != token)
        i = (i + 1) & (d->cap - 1);
    return i;
}

/* Empty slot i, moving back the entries of its probe run that may take its place. */
static void remove_at(ps_dedup *d, uint32_t i)
{
    uint32_t mask = d->cap - 1;
    for (uint32_t j = (i + 1) & mask; d->slot[j].seq; j = (j + 1) & mask) {
        uint32_t h = home(d->slot[j].token, d->cap);
        if (((j - h) & mask) >= ((j - i) & mask)) { /* i lies on j's probe from its home */
            d->slot[i] = d->slot[j];
            i = j;
        }
    }
    d->slot[i] = (ps_applied){0};
    d->n--;
}

static void put(ps_dedup *d, ps_applied e)
{
    uint32_t i = find(d, e.token);
    if (!d->slot[i].seq)
        d->n++;
    d->slot[i] = e;
}

/* cap slots (a power of two) holding d's entries; on failure d is as it was. */
static int rehash(ps_dedup *d, uint32_t cap)
{
    ps_applied *old = d->slot, *slot = calloc(cap, sizeof *slot);
    uint32_t old_cap = d->cap;
    if (!slot)
        return EDL_ENOMEM;
    /* stored atomically: ps_dedup_prefetch reads them without the shard's lock */
    __atomic_store_n(&d->slot, slot, __ATOMIC_RELAXED);
    __atomic_store_n(&d->cap, cap, __ATOMIC_RELAXED);
    d->n = 0;
    for (uint32_t i = 0; i < old_cap; i++)
        if (old[i].seq)
            put(d, old[i]);
    free(old);
    return 0;
}

static uint32_t least_recent(const ps_dedup *d)
{
    uint32_t least = UINT32_MAX;
    for (uint32_t i = 0; i < d->cap; i++)
        if (d->slot[i].seq && (least == UINT32_MAX || d->slot[i].used < d->slot[least].used))
            least = i;
    return least;
}

/* A client seen first: room made (the table doubled, or at PS_DEDUP_MAX the client used least
 * recently forgotten), then its entry. Out of memory with no room, nothing is remembered. */
static void remember(ps_dedup *d, const ps_push_id *id, uint64_t req)
{
    if (d->n >= PS_DEDUP_MAX)
        remove_at(d, least_recent(d));
    else if (2 * (d->n + 1) > d->cap && rehash(d, d->cap ? 2 * d->cap : 8) != 0)
        return;
    put(d, (ps_applied){id->token, id->seq, req, req});
}

bool ps_dedup_admit(ps_dedup *d, const ps_push_id *id, uint64_t req)
{
    if (!id || !id->seq) /* no identity, or none a client sends: applied, not remembered */
        return true;
    if (d->cap) {
        ps_applied *e = &d->slot[find(d, id->token)];
        if (e->seq) {
            if (e->seq > id->seq || (e->seq == id->seq && e->req != req))
                return false;
            e->seq = id->seq, e->req = e->used = req;
            return true;
        }
    }
    remember(d, id, req);
    return true;
}

void ps_dedup_prefetch(const ps_dedup *d, const ps_push_id *id)
{
    /* no lock: a table replaced meanwhile wastes the hint (a prefetch never faults) */
    const ps_applied *slot = __atomic_load_n(&d->slot, __ATOMIC_RELAXED);
    uint32_t cap = __atomic_load_n(&d->cap, __ATOMIC_RELAXED);
    if (id && cap)
        __builtin_prefetch(&slot[home(id->token, cap)], 1);
}

size_t ps_dedup_bytes(const ps_dedup *d)
{
    return 16 * (size_t)d->n;
}

static int by_first_u64(const void *a, const void *b)
{
    uint64_t x, y;
    memcpy(&x, a, 8), memcpy(&y, b, 8);
    return (x > y) - (x < y);
}

/* Least recently used first. The 16 bytes of each record first hold (used, slot), sorted in
 * place, then the slot's (token, seq). */
void ps_dedup_put(const ps_dedup *d, uint8_t *p)
{
    size_t n = 0;
    for (uint64_t i = 0; i < d->cap; i++)
        if (d->slot[i].seq) {
            memcpy(p + 16 * n, &d->slot[i].used, 8), memcpy(p + 16 * n + 8, &i, 8);
            n++;
        }
    qsort(p, n, 16, by_first_u64);
    for (size_t k = 0; k < n; k++) {
        uint64_t i;
        memcpy(&i, p + 16 * k + 8, 8);
        edl_put64(p + 16 * k, d->slot[i].token), edl_put64(p + 16 * k + 8, d->slot[i].seq);
    }
}

int ps_dedup_get(ps_dedup *d, const uint8_t *p, uint32_t n)
{
    if (n > PS_DEDUP_MAX)
        return EDL_EPROTO;
    uint32_t cap = 8;
    while (cap < 2 * n)
        cap *= 2;
    if (n && rehash(d, cap) != 0)
        return EDL_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        /* req 0: never a request's number; used: its place (least recent first) */
        ps_applied e = {edl_get64(p + 16 * i), edl_get64(p + 16 * i + 8), 0, i};
        uint32_t at = find(d, e.token);
        if (!e.seq || d->slot[at].seq) { /* a push numbered 0, or a client named twice */
            ps_dedup_free(d);
            return EDL_EPROTO;
        }
        d->slot[at] = e;
        d->n++;
    }
    return 0;
}

void ps_dedup_free(ps_dedup *d)
{
    free(d->slot);
    __atomic_store_n(&d->slot, NULL, __ATOMIC_RELAXED);
    __atomic_store_n(&d->cap, 0, __ATOMIC_RELAXED);
    d->n = 0;
}
