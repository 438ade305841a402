/* fuzz_ps_proto.c: feeds every input to the parameter server's wire parsers (ps/proto.c) as a
 * peer would send it. The first byte picks what the rest is: 0 a frame (header, then body)
 * that, when it parses, is also served by fresh tables (a sparse one of dim 4, a CTR one of
 * dim 4 whose pushes are 6 floats a key, and a dense one of 4,096 floats, all SGD) as the
 * server would, a SHRINK shrinking the CTR table after its push; 1 a hello, 2 a challenge, 3
 * a proof, 4 a table config; 5 a shard's bytes (ps_table_shard_export's, as a hand-over or a
 * PS checkpoint brings them) imported into the CTR table; 6 the same into shard 3 of a sparse
 * Adam table with GEO bits (the next byte even) or of a dense Adagrad one (odd). Asserts
 * beyond "no crash": a refusal always says why; a request that parses has counts that agree
 * with its length and arrays inside its body; a config that parses passes the config check
 * and encodes back to the same bytes; an imported shard exports back to the same bytes, and
 * a refused one leaves the shard empty. */
#include "fuzz.h"

#include "ps/internal.h"

static void serve(const ps_request *r, const uint8_t *body, uint32_t len)
{
    edl_ps_table_config sc, dc;
    edl_ps_table_config_init(&sc);
    sc.dim = 4;
    sc.shards = 16;
    dc = sc;
    dc.kind = EDL_PS_DENSE, dc.dim = 1, dc.size = 4096;
    ps_table *sp, *dn, *ctr;
    FUZZ_CHECK(ps_table_new(&sc, &sp) == 0 && ps_table_new(&dc, &dn) == 0);
    sc.accessor = EDL_PS_ACCESSOR_CTR;
    sc.ctr.embedx_threshold = 1;
    FUZZ_CHECK(ps_table_new(&sc, &ctr) == 0);
    static float out[1 << 16];
    uint64_t evicted, left;
    int rc = 0;
    if (r->h.type == PS_PULL_SPARSE && (uint64_t)r->n * 4 <= sizeof out / sizeof *out)
        rc = ps_table_pull_sparse(sp, r->keys, r->n, out);
    else if (r->h.type == PS_PUSH_SPARSE && r->dim == 4)
        rc = ps_table_push_sparse(sp, r->keys, r->n, r->values, &r->id);
    else if (r->h.type == PS_PUSH_SPARSE && r->dim == ps_push_width(&sc)) {
        rc = ps_table_push_sparse(ctr, r->keys, r->n, r->values, &r->id);
        FUZZ_CHECK(rc || ps_table_shrink(ctr, r->n, NULL, NULL, &evicted, &left) == 0);
        FUZZ_CHECK(rc || evicted + left <= r->n);
        if (rc == 0 && (uint64_t)r->n * 4 <= sizeof out / sizeof *out)
            rc = ps_table_pull_sparse(ctr, r->keys, r->n, out);
    } else if (r->h.type == PS_SHRINK) {
        FUZZ_CHECK(ps_table_shrink(ctr, r->token, NULL, NULL, &evicted, &left) == 0);
        FUZZ_CHECK(ps_table_shrink(sp, r->token, NULL, NULL, &evicted, &left) == EDL_EINVAL);
    }
    uint64_t done = 0;
    for (uint32_t i = 0; (r->h.type == PS_PULL_DENSE || r->h.type == PS_PUSH_DENSE) &&
                         i < r->nseg && rc == 0; i++) {
        uint64_t off, cnt;
        ps_segment_get(r->segs, i, &off, &cnt);
        if (off + cnt <= 4096 && r->h.type == PS_PUSH_DENSE)
            rc = ps_table_push_dense(dn, off, cnt, r->values + 4 * done, &r->id);
        else if (off + cnt <= 4096)
            rc = ps_table_pull_dense(dn, off, cnt, out);
        done += cnt;
    }
    FUZZ_CHECK(rc == 0);
    FUZZ_CHECK(!r->values || (r->values >= body && r->values <= body + len));
    ps_table_free(sp);
    ps_table_free(dn);
    ps_table_free(ctr);
}

/* A shard's bytes from a peer into shard 0 of a CTR table: refused with a reason, or taken
 * whole (then they export back the same). */
static void shard(const uint8_t *data, size_t size)
{
    edl_ps_table_config cfg;
    edl_ps_table_config_init(&cfg);
    cfg.dim = 4, cfg.shards = 1, cfg.optimizer = EDL_PS_ADAM;
    cfg.accessor = EDL_PS_ACCESSOR_CTR;
    ps_table *t;
    FUZZ_CHECK(ps_table_new(&cfg, &t) == 0);
    char why[256] = "";
    uint8_t *p = malloc(size ? size : 1), *back;
    size_t len;
    memcpy(p, data, size);
    int rc = ps_table_shard_import(t, 0, p, size, why, sizeof why);
    FUZZ_CHECK(rc == 0 || (rc == EDL_EPROTO && why[0]) || rc == EDL_ENOMEM);
    if (rc == 0) {
        FUZZ_CHECK(ps_table_shard_export(t, 0, false, &back, &len) == 0);
        FUZZ_CHECK(len == size && memcmp(back, p, size) == 0);
        free(back);
    }
    free(p);
    ps_table_free(t);
}

static void frame(const uint8_t *data, size_t size)
{
    char why[512] = "";
    ps_hdr h;
    if (size < PS_HDR_BYTES)
        return;
    int rc = ps_hdr_parse(data, 1 << 20, &h, why, sizeof why);
    FUZZ_CHECK(rc == 0 || why[0]);
    if (rc || h.len != size - PS_HDR_BYTES)
        return;
    ps_request r;
    uint8_t *body = malloc(h.len ? h.len : 1); /* the server's bodies are heap-aligned */
    memcpy(body, data + PS_HDR_BYTES, h.len);
    why[0] = '\0';
    rc = ps_request_parse(&h, body, &r, why, sizeof why);
    FUZZ_CHECK(rc == 0 || why[0]);
    bool push = h.type == PS_PUSH_SPARSE || h.type == PS_PUSH_DENSE;
    uint64_t pre = !push ? 0 : PS_ID_PREFIX + (h.flags == PS_F_SYNC ? PS_SYNC_PREFIX
                                               : h.flags == PS_F_GEO ? PS_GEO_PREFIX : 0);
    if (rc == 0 && (h.type == PS_PULL_SPARSE || h.type == PS_PUSH_SPARSE))
        FUZZ_CHECK(pre + 8 + 8 * (uint64_t)r.n + (r.values ? 4 * (uint64_t)r.n * r.dim : 0) ==
                   h.len);
    if (rc == 0 && (h.type == PS_PULL_DENSE || h.type == PS_PUSH_DENSE))
        FUZZ_CHECK(pre + 8 + 16 * (uint64_t)r.nseg + (r.values ? 4 * r.total : 0) == h.len);
    if (rc == 0)
        serve(&r, body, h.len);
    free(body);
}

static void shard_bytes(const uint8_t *data, size_t size)
{
    if (size < 1)
        return;
    edl_ps_table_config c;
    edl_ps_table_config_init(&c);
    c.shards = 8;
    if (data[0] & 1) {
        c.kind = EDL_PS_DENSE, c.dim = 1, c.size = 100, c.optimizer = EDL_PS_ADAGRAD;
    } else {
        c.dim = 2, c.optimizer = EDL_PS_ADAM, c.geo_trainers = 3;
    }
    ps_table *a, *b;
    FUZZ_CHECK(ps_table_new(&c, &a) == 0 && ps_table_new(&c, &b) == 0);
    char why[256] = "";
    uint8_t *x = NULL, *y = NULL;
    size_t xl, yl;
    int rc = ps_table_shard_import(a, 3, data + 1, size - 1, why, sizeof why);
    FUZZ_CHECK(rc == 0 || why[0]);
    FUZZ_CHECK(ps_table_shard_export(a, 3, false, &x, &xl) == 0);
    if (rc == 0) {
        FUZZ_CHECK(ps_table_shard_import(b, 3, x, xl, why, sizeof why) == 0);
        FUZZ_CHECK(ps_table_shard_export(b, 3, false, &y, &yl) == 0);
        FUZZ_CHECK(xl == yl && memcmp(x, y, xl) == 0);
    } else {
        FUZZ_CHECK(ps_table_shard_empty(a, 3)); /* left empty */
    }
    free(x), free(y);
    ps_table_free(a), ps_table_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    if (size < 1)
        return 0;
    uint8_t nonce[PS_NONCE_BYTES], mac[EDL_SECRET_MAC_BYTES], again[PS_CONFIG_BYTES];
    char why[256] = "";
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    int rc = 0;
    edl_ps_table_config cfg;
    switch (data[0]) {
    case 0: frame(p, n); return 0;
    case 5: shard(p, n); return 0;
    case 6: shard_bytes(p, n); return 0;
    case 1: rc = ps_hello_parse(p, n, nonce, why, sizeof why); break;
    case 2: rc = ps_challenge_parse(p, n, nonce, mac, why, sizeof why); break;
    case 3: rc = ps_proof_parse(p, n, mac, why, sizeof why); break;
    case 4:
        if (n != PS_CONFIG_BYTES)
            return 0;
        if ((rc = ps_config_parse(p, &cfg, why, sizeof why)) == 0) {
            FUZZ_CHECK(edl_ps_table_config_check(&cfg, why, sizeof why) == 0);
            ps_config_encode(&cfg, again);
            FUZZ_CHECK(memcmp(again, p, PS_CONFIG_BYTES) == 0);
        }
        break;
    default: return 0;
    }
    FUZZ_CHECK(rc == 0 || (rc == EDL_EPROTO && why[0]));
    return 0;
}
