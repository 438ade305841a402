/* algo.c: the collective algorithms of the CPU group, on top of coll_sendrecv().
 *   allreduce: ring (reduce-scatter then allgather, each block pipelined in segments) for
 *              large messages; recursive doubling, with the usual fold for world sizes that
 *              are not powers of two, for small ones. Every rank ends with bit-identical
 *              results (each element is reduced once by one rank, or symmetrically).
 *   broadcast: binomial tree for small messages, a pipelined chain for large ones.
 *   allgather, reduce_scatter: rings.
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

static size_t nseg(size_t elems, size_t seg)
{
    return elems == 0 ? 1 : (elems + seg - 1) / seg;
}

static size_t seg_len(size_t elems, size_t seg, size_t i)
{
    size_t off = i * seg;
    return off >= elems ? 0 : (elems - off < seg ? elems - off : seg);
}

/* One ring step: send the block at sblk (slen elements) to next while receiving rlen elements
 * from prev, segment by segment. With rsrc, received segments land in the stage and
 * dst[i] = rsrc[i] op stage[i]; without, they land in dst directly. Pointers are to the
 * blocks' first elements. */
typedef struct ring_step {
    const char *sblk;
    size_t slen;
    char *dst;
    const char *rsrc; /* NULL: no reduction */
    size_t rlen;
} ring_step;

static int ring_transfer(edl_comm *c, const coll_op *op, int next, int prev, const ring_step *st)
{
    size_t es = edl_dtype_size(op->dt);
    size_t seg = c->seg_bytes / es ? c->seg_bytes / es : 1;
    size_t ns = nseg(st->slen, seg), nr = nseg(st->rlen, seg);
    char *stage = NULL;
    if (st->rsrc && !(stage = coll_stage(c, seg * es)))
        return EDL_ENOMEM;
    for (size_t i = 0; i < (ns > nr ? ns : nr); i++) {
        size_t sl = seg_len(st->slen, seg, i), rl = seg_len(st->rlen, seg, i), o = i * seg * es;
        int rc = coll_sendrecv(c, op, i < ns ? next : -1, sl ? st->sblk + o : NULL, sl * es,
                               i < nr ? prev : -1, st->rsrc ? stage : (rl ? st->dst + o : NULL),
                               rl * es);
        if (rc)
            return rc;
        if (st->rsrc && i < nr && rl)
            coll_reduce(st->dst + o, st->rsrc + o, stage, rl, op->dt, op->op);
    }
    return 0;
}

static int ring_allreduce(edl_comm *c, const coll_op *op, const void *send, void *recv)
{
    int n = c->size, r = c->rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    size_t es = edl_dtype_size(op->dt), count = op->count;
    char *dst = recv;
    for (int s = 0; s < n - 1; s++) { /* reduce-scatter: rank r ends owning block r+1 */
        int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
        size_t so = blk_off(count, n, sb) * es, ro = blk_off(count, n, rb) * es;
        ring_step st = {.sblk = (s == 0 ? (const char *)send : dst) + so,
                        .slen = blk_len(count, n, sb), .dst = dst + ro,
                        .rsrc = (const char *)send + ro, .rlen = blk_len(count, n, rb)};
        int rc = ring_transfer(c, op, next, prev, &st);
        if (rc)
            return rc;
    }
    int own = (r + 1) % n;
    if (op->op == EDL_AVG)
        coll_scale_avg(dst + blk_off(count, n, own) * es, blk_len(count, n, own), op->dt, n);
    for (int s = 0; s < n - 1; s++) { /* allgather of the reduced blocks */
        int sb = (r + 1 - s + n) % n, rb = (r - s + n) % n;
        ring_step st = {.sblk = dst + blk_off(count, n, sb) * es, .slen = blk_len(count, n, sb),
                        .dst = dst + blk_off(count, n, rb) * es, .rlen = blk_len(count, n, rb)};
        int rc = ring_transfer(c, op, next, prev, &st);
        if (rc)
            return rc;
    }
    return 0;
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

/* A chain root -> root+1 -> ...: while segment i comes in, segment i-1 goes on. */
static int chain_broadcast(edl_comm *c, const coll_op *op, const char *src, char *buf,
                           size_t bytes)
{
    int n = c->size, vr = (c->rank - op->root + n) % n;
    int prev = vr > 0 ? (c->rank - 1 + n) % n : -1, next = vr < n - 1 ? (c->rank + 1) % n : -1;
    size_t seg = c->seg_bytes, ns = nseg(bytes, seg);
    for (size_t i = 0; i <= ns; i++) {
        bool s = next >= 0 && i >= 1, rv = prev >= 0 && i < ns;
        if (!s && !rv)
            continue;
        size_t so = (i - (i ? 1 : 0)) * seg, ro = i * seg;
        int rc = coll_sendrecv(c, op, s ? next : -1, src + so, s ? seg_len(bytes, seg, i - 1) : 0,
                               rv ? prev : -1, buf + ro, rv ? seg_len(bytes, seg, i) : 0);
        if (rc)
            return rc;
    }
    return 0;
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

int coll_cpu_allgather(edl_comm *c, const coll_op *op, const void *send, void *recv)
{
    int n = c->size, r = c->rank;
    size_t bytes = op->count * edl_dtype_size(op->dt);
    char *dst = recv;
    if (send != dst + (size_t)r * bytes)
        memmove(dst + (size_t)r * bytes, send, bytes);
    for (int s = 0; s < n - 1; s++) {
        int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
        ring_step st = {.sblk = dst + (size_t)sb * bytes, .slen = op->count,
                        .dst = dst + (size_t)rb * bytes, .rlen = op->count};
        int rc = ring_transfer(c, op, (r + 1) % n, (r - 1 + n) % n, &st);
        if (rc)
            return rc;
    }
    return 0;
}

int coll_cpu_reduce_scatter(edl_comm *c, const coll_op *op, const void *send, void *recv)
{
    int n = c->size, r = c->rank;
    size_t es = edl_dtype_size(op->dt), m = op->count, bytes = m * es;
    if (n == 1) {
        if (send != recv)
            memmove(recv, send, bytes);
        return 0;
    }
    char *work = coll_work(c, bytes ? 2 * bytes : 1);
    if (!work)
        return EDL_ENOMEM;
    const char *in = send;
    const char *prev_acc = NULL;
    for (int s = 0; s < n - 1; s++) { /* rank r ends owning block r */
        int sb = (r - s - 1 + n) % n, rb = (r - s - 2 + n) % n;
        char *acc = s == n - 2 ? (char *)recv : work + (size_t)(s % 2) * bytes;
        ring_step st = {.sblk = s == 0 ? in + (size_t)sb * bytes : prev_acc, .slen = m,
                        .dst = acc, .rsrc = in + (size_t)rb * bytes, .rlen = m};
        int rc = ring_transfer(c, op, (r + 1) % n, (r - 1 + n) % n, &st);
        if (rc)
            return rc;
        prev_acc = acc;
    }
    if (op->op == EDL_AVG)
        coll_scale_avg(recv, m, op->dt, n);
    return 0;
}
