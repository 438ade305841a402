/* algo.c: the collective algorithms of the CPU group, on top of coll_sendrecv() (one message
 * each way) and coll_stream_run() (a stream of blocks per link).
 *   allreduce: ring in slices (each slice: reduce-scatter then allgather) for large messages;
 *              recursive doubling, with the usual fold for world sizes that are not powers of
 *              two, for small ones. Every rank ends with bit-identical results (each element
 *              is reduced once by one rank, or symmetrically).
 *   broadcast: binomial tree for small messages, a chain stream for large ones.
 *   allgather, reduce_scatter: ring streams.
 * Work buffers come from the communicator and are kept between calls. */
#include <string.h>

#include "internal.h"

static size_t blk_off(size_t count, int n, int b)
{
    return count / (size_t)n * (size_t)b + ((size_t)b < count % (size_t)n ? (size_t)b : count % (size_t)n);
}

static size_t blk_len(size_t count, int n, int b)
{
    return count / (size_t)n + ((size_t)b < count % (size_t)n);
}

/* The ring allreduce as one stream per link. The buffer is cut into slices of n blocks of
 * about block_bytes, and each slice is a ring allreduce of its own: reduce-scatter (step s
 * sends block r-s; rank r ends owning block r+1), then allgather of the reduced blocks. A step
 * forwards what the previous one received, so data is forwarded a block after it arrived,
 * while it is still in cache; slices follow each other with no boundary, so the links never
 * drain. */
static int ring_allreduce(edl_comm *c, const coll_op *op, const void *send, void *recv)
{
    int n = c->size, r = c->rank, steps = 2 * (n - 1);
    size_t es = edl_dtype_size(op->dt), count = op->count;
    size_t per = c->block_bytes / es ? c->block_bytes / es : 1; /* elements per block */
    size_t slice = per * (size_t)n, nslices = (count + slice - 1) / slice;
    size_t most = (size_t)(65536 / steps) ? (size_t)(65536 / steps) : 1; /* bounds the plan */
    if (nslices > most) {
        slice = (count + most - 1) / most;
        nslices = (count + slice - 1) / slice;
    }
    int nb = (int)nslices * steps;
    coll_blk *b = coll_plan(c, nb);
    if (!b)
        return EDL_ENOMEM;
    for (size_t k = 0; k < nslices; k++) {
        size_t base = k * slice, m = count - base < slice ? count - base : slice;
        const char *in = (const char *)send + base * es;
        char *dst = (char *)recv + base * es;
        for (int j = 0; j < steps; j++) {
            bool rs = j < n - 1;
            int s = rs ? j : j - (n - 1), idx = (int)k * steps + j;
            int sb = rs ? (r - s + n) % n : (r + 1 - s + n) % n;
            int rb = rs ? (r - s - 1 + n) % n : (r - s + n) % n;
            size_t so = blk_off(m, n, sb) * es, ro = blk_off(m, n, rb) * es;
            b[idx] = (coll_blk){.src = (j == 0 ? in : dst) + so, .slen = blk_len(m, n, sb) * es,
                                .dst = dst + ro, .red = rs ? in + ro : NULL,
                                .rlen = blk_len(m, n, rb) * es, .dep = j == 0 ? -1 : idx - 1,
                                .wait_sent = -1, .scale = j == n - 2 && op->op == EDL_AVG};
        }
    }
    coll_stream st = {.to = (r + 1) % n, .from = (r + n - 1) % n, .b = b, .nb = nb};
    return coll_stream_run(c, op, &st);
}

/* Recursive doubling. Ranks below 2*rem (rem = n - largest power of two) pair up first: the
 * even one hands its data to the odd one and gets the result back at the end. */
static int rd_allreduce(edl_comm *c, const coll_op *op, const void *send, void *recv)
{
    int n = c->size, r = c->rank, p = 1;
    while (p * 2 <= n)
        p *= 2;
    int rem = n - p;
    size_t es = edl_dtype_size(op->dt), bytes = op->count * es;
    char *acc = recv, *stage = coll_stage(c, bytes ? bytes : 1);
    if (!stage)
        return EDL_ENOMEM;
    if (send != recv)
        memcpy(acc, send, bytes);
    int vr, rc;
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            if ((rc = coll_sendrecv(c, op, r + 1, acc, bytes, -1, NULL, 0)))
                return rc;
            vr = -1;
        } else {
            if ((rc = coll_sendrecv(c, op, -1, NULL, 0, r - 1, stage, bytes)))
                return rc;
            coll_reduce(acc, acc, stage, op->count, op->dt, op->op);
            vr = r / 2;
        }
    } else {
        vr = r - rem;
    }
    if (vr >= 0) {
        for (int mask = 1; mask < p; mask <<= 1) {
            int vp = vr ^ mask, peer = vp < rem ? vp * 2 + 1 : vp + rem;
            if ((rc = coll_sendrecv(c, op, peer, acc, bytes, peer, stage, bytes)))
                return rc;
            coll_reduce(acc, acc, stage, op->count, op->dt, op->op);
        }
    }
    if (r < 2 * rem) {
        if (r % 2 == 0)
            rc = coll_sendrecv(c, op, -1, NULL, 0, r + 1, acc, bytes);
        else
            rc = coll_sendrecv(c, op, r - 1, acc, bytes, -1, NULL, 0);
        if (rc)
            return rc;
    }
    if (op->op == EDL_AVG)
        coll_scale_avg(acc, op->count, op->dt, n);
    return 0;
}

int coll_cpu_allreduce(edl_comm *c, const coll_op *op, const void *send, void *recv)
{
    size_t bytes = op->count * edl_dtype_size(op->dt);
    if (c->size == 1) {
        if (send != recv)
            memcpy(recv, send, bytes);
        if (op->op == EDL_AVG)
            coll_scale_avg(recv, op->count, op->dt, 1);
        return 0;
    }
    if (bytes <= c->small_bytes || op->count < (size_t)c->size)
        return rd_allreduce(c, op, send, recv);
    return ring_allreduce(c, op, send, recv);
}

static int tree_broadcast(edl_comm *c, const coll_op *op, char *buf, size_t bytes)
{
    int n = c->size, vr = (c->rank - op->root + n) % n, mask = 1, rc;
    while (mask < n) {
        if (vr & mask) {
            if ((rc = coll_sendrecv(c, op, -1, NULL, 0, (vr - mask + op->root) % n, buf, bytes)))
                return rc;
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < n &&
            (rc = coll_sendrecv(c, op, (vr + mask + op->root) % n, buf, bytes, -1, NULL, 0)))
            return rc;
    return 0;
}

/* A chain root -> root+1 -> ...: each rank forwards the data while it is still arriving. */
static int chain_broadcast(edl_comm *c, const coll_op *op, const char *src, char *buf,
                           size_t bytes)
{
    int n = c->size, vr = (c->rank - op->root + n) % n;
    coll_blk b = {.src = src, .slen = vr < n - 1 ? bytes : 0, .dst = buf,
                  .rlen = vr > 0 ? bytes : 0, .dep = vr == 0 ? -1 : 0, .wait_sent = -1};
    coll_stream st = {.to = vr < n - 1 ? (c->rank + 1) % n : -1,
                      .from = vr > 0 ? (c->rank - 1 + n) % n : -1, .b = &b, .nb = 1};
    return coll_stream_run(c, op, &st);
}

int coll_cpu_broadcast(edl_comm *c, const coll_op *op, const void *send, void *recv)
{
    size_t bytes = op->count * edl_dtype_size(op->dt);
    bool root = c->rank == op->root;
    if (root && send != recv)
        memcpy(recv, send, bytes);
    if (c->size == 1)
        return 0;
    if (bytes <= c->small_bytes)
        return tree_broadcast(c, op, recv, bytes);
    return chain_broadcast(c, op, root ? (const char *)send : (const char *)recv, recv, bytes);
}

/* Out of place, a block larger than the sliced allreduce's (c->block_bytes, cache-sized) goes
 * out straight from send and is copied into recv piece by piece as it goes (coll_blk.copy),
 * while it is in cache: a copy up front cost a pass over memory before the first byte moved
 * (bench/allreduce --collective allgather, 2 cores: 12-17 % faster at n = 2 from 16 MiB, 3-6 %
 * at n = 3, no change at n = 4). Smaller blocks, and send and recv that overlap without being
 * in place, keep the copy up front (for 512 KiB blocks at n = 2 it was 5 % faster). */
int coll_cpu_allgather(edl_comm *c, const coll_op *op, const void *send, void *recv)
{
    int n = c->size, r = c->rank;
    size_t bytes = op->count * edl_dtype_size(op->dt);
    char *dst = recv, *mine = dst + (size_t)r * bytes;
    const char *s = send;
    bool apart = (s + bytes <= dst || s >= dst + (size_t)n * bytes) && bytes > c->block_bytes;
    if (s != mine && (n == 1 || !apart))
        memmove(mine, send, bytes);
    if (n == 1)
        return 0;
    coll_blk *b = coll_plan(c, n - 1);
    if (!b)
        return EDL_ENOMEM;
    for (int j = 0; j < n - 1; j++) /* send block r-j, receive block r-j-1 */
        b[j] = (coll_blk){.src = dst + (size_t)((r - j + n) % n) * bytes, .slen = bytes,
                          .dst = dst + (size_t)((r - j - 1 + n) % n) * bytes, .rlen = bytes,
                          .dep = j - 1, .wait_sent = -1};
    if (s != mine && apart) {
        b[0].src = s;
        b[0].copy = mine;
    }
    coll_stream st = {.to = (r + 1) % n, .from = (r - 1 + n) % n, .b = b, .nb = n - 1};
    return coll_stream_run(c, op, &st);
}

/* Rank r ends owning block r. The partial sums of step j land in one of two work halves,
 * alternately, so block j's half is block j-2's, which send block j-1 forwards: the receive
 * stays behind what of that has gone out. The last step reduces into the caller's buffer. */
int coll_cpu_reduce_scatter(edl_comm *c, const coll_op *op, const void *send, void *recv)
{
    int n = c->size, r = c->rank;
    size_t es = edl_dtype_size(op->dt), m = op->count, bytes = m * es;
    if (n == 1) {
        if (send != recv)
            memmove(recv, send, bytes);
        if (op->op == EDL_AVG)
            coll_scale_avg(recv, m, op->dt, 1);
        return 0;
    }
    char *work = coll_work(c, bytes ? 2 * bytes : 1);
    coll_blk *b = coll_plan(c, n - 1);
    if (!work || !b)
        return EDL_ENOMEM;
    const char *in = send;
    for (int j = 0; j < n - 1; j++) {
        int sb = (r - j - 1 + n) % n, rb = (r - j - 2 + 2 * n) % n;
        char *acc = j == n - 2 ? (char *)recv : work + (size_t)(j % 2) * bytes;
        b[j] = (coll_blk){.src = j == 0 ? in + (size_t)sb * bytes : b[j - 1].dst, .slen = bytes,
                          .dst = acc, .red = in + (size_t)rb * bytes, .rlen = bytes,
                          .dep = j - 1, .wait_sent = j >= 2 && j < n - 2 ? j - 1 : -1,
                          .scale = j == n - 2 && op->op == EDL_AVG};
    }
    coll_stream st = {.to = (r + 1) % n, .from = (r - 1 + n) % n, .b = b, .nb = n - 1};
    return coll_stream_run(c, op, &st);
}
