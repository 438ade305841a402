/* checkpoint_stage.c: the staging memory that asynchronous saves copy the caller's shards into.
 *
 * Fresh memory costs a page fault per page on first touch, which on some machines is slower
 * than the disk: copying 1 GiB into new malloc'd memory stalled training for seconds. So a
 * checkpoint handle keeps its staging areas for its whole life: an area is mapped and faulted
 * in once, then reused by every later save that fits, and the caller's stall is the copy
 * alone. A save that needs more than a free area holds replaces it with a larger one; a save
 * queued while the previous one still uploads from its area gets a second area, also kept.
 * An area that has held a device shard is pinned (registered with CUDA) until it is unmapped. */
#define _GNU_SOURCE
#include "checkpoint_internal.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define STAGE_ROUND (2u << 20) /* areas are whole 2 MiB */

struct ckpt_stage {
    char *mem;
    size_t cap;
    bool busy;
    bool pinned; /* registered with CUDA (unpinned before it is unmapped) */
    ckpt_stage *next;
};

void ckpt_stages_init(ckpt_stages *st)
{
    pthread_mutex_init(&st->mu, NULL);
    st->list = NULL;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels refuse it with EINVAL */
#endif

/* Map cap bytes and fault every page in now. A save that grows its staging pays for it anyway
 * and takes the cheapest way: one call where the kernel can (MADV_POPULATE_WRITE: 0.3 s a GiB
 * on one machine, against 1.2 s touching page by page). A reservation (every_page) writes every
 * page instead, so that the first copy into it runs at memory speed: in a virtual machine whose
 * host backs guest memory lazily (this one's), populated memory is still slow on its first
 * write: 1 GiB populated in 1.0-1.4 s took 1.6-2.2 s for its first memcpy (the next 0.07 s),
 * against 3.7-3.9 s page by page and then 0.07 s (bench/checkpoint: "first after reserve").
 * No transparent huge pages: asking for them made the first fault-in up to 7x slower here
 * (compaction), for no faster copy afterwards. */
static char *map_faulted(size_t cap, bool every_page)
{
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (!every_page && madvise(p, cap, MADV_POPULATE_WRITE) == 0)
        return p;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < cap; off += page)
        ((volatile char *)p)[off] = 0;
    return p;
}

static void stage_unmap(ckpt_stage *a)
{
    if (a->pinned)
        ckpt_cuda_unpin(a->mem);
    if (a->mem)
        munmap(a->mem, a->cap);
    a->mem = NULL;
    a->pinned = false;
}

/* Give a busy area at least bytes of faulted memory (its old bytes are not kept). */
static int stage_grow(ckpt_stage *a, size_t bytes, bool every_page)
{
    if (a->cap >= bytes)
        return 0;
    size_t cap = (bytes + STAGE_ROUND - 1) / STAGE_ROUND * STAGE_ROUND;
    stage_unmap(a);
    a->mem = map_faulted(cap, every_page);
    a->cap = a->mem ? cap : 0;
    return a->mem ? 0 : EDL_ENOMEM;
}

/* Is free area a a better pick than best for bytes: one that fits over one that does not, the
 * smallest that fits, or (when none fits) the largest, to grow. */
static bool better(const ckpt_stage *a, const ckpt_stage *best, size_t bytes)
{
    if (!best)
        return true;
    bool fits = a->cap >= bytes, best_fits = best->cap >= bytes;
    if (fits != best_fits)
        return fits;
    return fits ? a->cap < best->cap : a->cap > best->cap;
}

static ckpt_stage *pick_free(ckpt_stages *st, size_t bytes)
{
    ckpt_stage *best = NULL;
    for (ckpt_stage *a = st->list; a; a = a->next)
        if (!a->busy && better(a, best, bytes))
            best = a;
    return best;
}

ckpt_stage *ckpt_stage_take(ckpt_stages *st, size_t bytes, bool every_page, char **mem)
{
    pthread_mutex_lock(&st->mu);
    ckpt_stage *a = pick_free(st, bytes);
    if (!a && (a = calloc(1, sizeof *a))) {
        a->next = st->list;
        st->list = a;
    }
    if (a)
        a->busy = true;
    pthread_mutex_unlock(&st->mu);
    if (!a)
        return NULL;
    if (stage_grow(a, bytes, every_page) != 0) { /* outside the lock: faulting in takes a while */
        ckpt_stage_give(st, a);
        return NULL;
    }
    *mem = a->mem;
    return a;
}

void ckpt_stage_give(ckpt_stages *st, ckpt_stage *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&st->mu);
    a->busy = false;
    pthread_mutex_unlock(&st->mu);
}

void ckpt_stages_clear(ckpt_stages *st)
{
    while (st->list) {
        ckpt_stage *a = st->list;
        st->list = a->next;
        stage_unmap(a);
        free(a);
    }
    pthread_mutex_destroy(&st->mu);
}

int ckpt_stage_pin(ckpt_stage *a, char *err, size_t errlen)
{
    if (a->pinned)
        return 0;
    int rc = ckpt_cuda_pin(a->mem, a->cap, err, errlen);
    a->pinned = rc == 0;
    return rc;
}
