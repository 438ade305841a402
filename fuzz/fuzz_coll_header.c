/* fuzz_coll_header.c: feeds every input as what a peer sends at the start of a collective
 * message: the first sizeof(coll_hdr) bytes are the header as it arrives off the socket
 * (collective/net.c copies them raw), the bytes after it pick the collective this rank runs
 * and the payload length it expects; coll_check_header judges the header against them.
 * Asserts beyond "no crash": a header is taken only when its magic, kind, type, count,
 * sequence number, reduction (where one applies), root (broadcast) and length match; a refusal
 * always says why (c->err). The link's handshake has its own target, fuzz_coll_hello.c. */
#include "fuzz.h"

#include "collective/internal.h"

static edl_comm comm; /* only rank, gen and err are read */

/* Little-endian integer of n bytes at *p, advancing it; zero past the end. */
static uint64_t take(const uint8_t **p, const uint8_t *end, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++, (*p)++)
        v |= (uint64_t)(*p < end ? **p : 0) << (8 * i);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    coll_hdr h = {0};
    memcpy(&h, data, size < sizeof h ? size : sizeof h);
    const uint8_t *p = data + (size < sizeof h ? size : sizeof h), *end = data + size;
    coll_op op = {.kind = (enum coll_kind)(take(&p, end, 1) % 6),
                  .dt = (edl_dtype)take(&p, end, 1),
                  .op = (edl_redop)take(&p, end, 1),
                  .root = (int)(int32_t)take(&p, end, 4),
                  .count = (size_t)take(&p, end, 8),
                  .seq = take(&p, end, 8)};
    size_t rlen = (size_t)take(&p, end, 8);
    comm.rank = 1;
    comm.gen = 7;
    comm.err[0] = '\0';
    int rc = coll_check_header(&comm, &op, 0, &h, rlen);
    bool match = h.magic == COLL_MAGIC && h.kind == op.kind && h.dtype == op.dt &&
                 h.count == op.count && h.seq == op.seq &&
                 (op.kind == COLL_BROADCAST || op.kind == COLL_ALLGATHER || h.op == op.op) &&
                 (op.kind != COLL_BROADCAST || h.root == op.root) && h.len == rlen;
    FUZZ_CHECK((rc == 0) == match);
    FUZZ_CHECK(rc == 0 || (rc == EDL_EPROTO && comm.err[0]));
    return 0;
}
