/* proto.c: the parameter server's wire format (see internal.h and docs/ps.md): the link
 * handshake, frame headers, request bodies, table configs and stats. No I/O here: every parser
 * takes a buffer and its length and checks each count against the length and the limits
 * before anyone allocates by it, so the fuzzer (fuzz/fuzz_ps_proto.c) can call them all. */
#include <math.h>
#include <string.h>

#include "edl/job.h"
#include "edl/wire.h"
#include "internal.h"

static void put_float(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    edl_put32(p, u);
}

static float get_float(const uint8_t *p)
{
    uint32_t u = edl_get32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- handshake ----------------------------------------------------------------------------- */

static void link_prefix(uint8_t *out)
{
    edl_put32(out, PS_LINK_MAGIC);
    edl_put16(out + 4, PS_PROTO_VERSION);
    edl_put16(out + 6, 0);
}

static int link_prefix_parse(const uint8_t *p, size_t len, size_t want, const char *what,
                             char *why, size_t whylen)
{
    if (len < 4 || edl_get32(p) != PS_LINK_MAGIC)
        return edl_errf(why, whylen, EDL_EPROTO, "the %s is not an edl parameter-server "
                        "handshake", what);
    if (len < 6 || edl_get16(p + 4) != PS_PROTO_VERSION)
        return edl_errf(why, whylen, EDL_EPROTO, "the %s speaks parameter-server protocol "
                        "version %u, this process version %u", what,
                        len < 6 ? 0u : edl_get16(p + 4), PS_PROTO_VERSION);
    if (len != want)
        return edl_errf(why, whylen, EDL_EPROTO, "the %s has %zu bytes, not %zu", what, len,
                        want);
    return 0;
}

void ps_hello_encode(const uint8_t nonce[PS_NONCE_BYTES], uint8_t out[PS_HELLO_BYTES])
{
    link_prefix(out);
    memcpy(out + 8, nonce, PS_NONCE_BYTES);
}

int ps_hello_parse(const uint8_t *p, size_t len, uint8_t nonce[PS_NONCE_BYTES], char *why,
                   size_t whylen)
{
    int rc = link_prefix_parse(p, len, PS_HELLO_BYTES, "hello", why, whylen);
    if (rc == 0)
        memcpy(nonce, p + 8, PS_NONCE_BYTES);
    return rc;
}

void ps_challenge_encode(const uint8_t nonce[PS_NONCE_BYTES], const uint8_t *mac,
                         uint8_t out[PS_CHALLENGE_BYTES])
{
    link_prefix(out);
    memcpy(out + 8, nonce, PS_NONCE_BYTES);
    memcpy(out + 8 + PS_NONCE_BYTES, mac, EDL_SECRET_MAC_BYTES);
}

int ps_challenge_parse(const uint8_t *p, size_t len, uint8_t nonce[PS_NONCE_BYTES],
                       uint8_t *mac, char *why, size_t whylen)
{
    int rc = link_prefix_parse(p, len, PS_CHALLENGE_BYTES, "server's challenge", why, whylen);
    if (rc == 0) {
        memcpy(nonce, p + 8, PS_NONCE_BYTES);
        memcpy(mac, p + 8 + PS_NONCE_BYTES, EDL_SECRET_MAC_BYTES);
    }
    return rc;
}

void ps_proof_encode(const uint8_t *mac, uint8_t out[PS_PROOF_BYTES])
{
    link_prefix(out);
    memcpy(out + 8, mac, EDL_SECRET_MAC_BYTES);
}

int ps_proof_parse(const uint8_t *p, size_t len, uint8_t *mac, char *why, size_t whylen)
{
    int rc = link_prefix_parse(p, len, PS_PROOF_BYTES, "client's proof", why, whylen);
    if (rc == 0)
        memcpy(mac, p + 8, EDL_SECRET_MAC_BYTES);
    return rc;
}

int ps_link_mac(const edl_job_secret *s, const char *job, enum ps_mac_dir dir,
                const uint8_t nc[PS_NONCE_BYTES], const uint8_t ns[PS_NONCE_BYTES],
                uint8_t *out)
{
    uint8_t transcript[2 * PS_NONCE_BYTES];
    memcpy(transcript, nc, PS_NONCE_BYTES);
    memcpy(transcript + PS_NONCE_BYTES, ns, PS_NONCE_BYTES);
    return edl_job_secret_link_mac(s, "edl-ps-link-v1", (uint8_t)dir, job, transcript,
                                   sizeof transcript, out);
}

/* ---- frames -------------------------------------------------------------------------------- */

void ps_hdr_encode(const ps_hdr *h, uint8_t out[PS_HDR_BYTES])
{
    edl_put32(out, PS_FRAME_MAGIC);
    out[4] = h->type;
    out[5] = h->flags;
    edl_put16(out + 6, h->table);
    edl_put32(out + 8, h->id);
    edl_put32(out + 12, h->len);
}

int ps_hdr_parse(const uint8_t *p, uint32_t max_body, ps_hdr *out, char *why, size_t whylen)
{
    if (edl_get32(p) != PS_FRAME_MAGIC)
        return edl_errf(why, whylen, EDL_EPROTO, "a frame that does not start with the "
                        "parameter server's magic (the stream is out of step)");
    ps_hdr h = {.type = p[4], .flags = p[5], .table = edl_get16(p + 6), .id = edl_get32(p + 8),
                .len = edl_get32(p + 12)};
    if (h.len > max_body)
        return edl_errf(why, whylen, EDL_ETOOBIG, "a frame of %u bytes, over the limit of %u "
                        "(max_message)", h.len, max_body);
    *out = h;
    return 0;
}

void ps_segment_get(const uint8_t *segs, uint32_t i, uint64_t *off, uint64_t *count)
{
    *off = edl_get64(segs + 16 * (size_t)i);
    *count = edl_get64(segs + 16 * (size_t)i + 8);
}

void ps_segment_put(uint8_t *segs, uint32_t i, uint64_t off, uint64_t count)
{
    edl_put64(segs + 16 * (size_t)i, off);
    edl_put64(segs + 16 * (size_t)i + 8, count);
}

static int parse_sparse(const ps_hdr *h, const uint8_t *b, ps_request *r, char *why,
                        size_t whylen)
{
    bool push = h->type == PS_PUSH_SPARSE;
    if (h->len < 8)
        return edl_errf(why, whylen, EDL_EPROTO, "a sparse request of %u bytes (its counts "
                        "take 8)", h->len);
    r->n = edl_get32(b);
    r->dim = push ? edl_get32(b + 4) : 0;
    if (push && (r->dim < 1 || r->dim > EDL_PS_MAX_DIM))
        return edl_errf(why, whylen, EDL_EPROTO, "a push with rows of %u floats (1..%d)",
                        r->dim, EDL_PS_MAX_DIM);
    uint64_t want = 8 + 8 * (uint64_t)r->n + (push ? 4 * (uint64_t)r->n * r->dim : 0);
    if (want != h->len)
        return edl_errf(why, whylen, EDL_EPROTO, "a sparse request of %u keys%s needs %llu "
                        "bytes, it has %u", r->n, push ? " and their rows" : "",
                        (unsigned long long)want, h->len);
    r->keys = b + 8;
    r->values = push ? b + 8 + 8 * (size_t)r->n : NULL;
    return 0;
}

static int parse_dense(const ps_hdr *h, const uint8_t *b, ps_request *r, char *why,
                       size_t whylen)
{
    bool push = h->type == PS_PUSH_DENSE;
    if (h->len < 8)
        return edl_errf(why, whylen, EDL_EPROTO, "a dense request of %u bytes (its count "
                        "takes 8)", h->len);
    r->nseg = edl_get32(b);
    if (8 + 16 * (uint64_t)r->nseg > h->len)
        return edl_errf(why, whylen, EDL_EPROTO, "a dense request of %u segments in %u bytes",
                        r->nseg, h->len);
    r->segs = b + 8;
    r->total = 0;
    for (uint32_t i = 0; i < r->nseg; i++) {
        uint64_t off, cnt;
        ps_segment_get(r->segs, i, &off, &cnt);
        if (cnt < 1 || cnt > EDL_PS_MAX_DENSE || off > EDL_PS_MAX_DENSE)
            return edl_errf(why, whylen, EDL_EPROTO, "dense segment %u: %llu elements at "
                            "%llu", i, (unsigned long long)cnt, (unsigned long long)off);
        r->total += cnt; /* at most 2^32 segments of 2^30: no overflow */
    }
    uint64_t want = 8 + 16 * (uint64_t)r->nseg + (push ? 4 * r->total : 0);
    if (want != h->len)
        return edl_errf(why, whylen, EDL_EPROTO, "a dense request of %u segments%s needs %llu "
                        "bytes, it has %u", r->nseg, push ? " and their values" : "",
                        (unsigned long long)want, h->len);
    r->values = push ? r->segs + 16 * (size_t)r->nseg : NULL;
    return 0;
}

static int parse_barrier(const ps_hdr *h, const uint8_t *b, ps_request *r, char *why,
                         size_t whylen)
{
    if (h->type == PS_BARRIER) {
        if (h->len != PS_BARRIER_BYTES)
            return edl_errf(why, whylen, EDL_EPROTO, "a barrier of %u bytes, not %d", h->len,
                            PS_BARRIER_BYTES);
        r->token = edl_get64(b);
        r->step = edl_get64(b + 8);
        r->trainers = edl_get32(b + 16);
        r->members_gen = edl_get32(b + 20);
        if (r->trainers < 1 || r->trainers > PS_MAX_SYNC_TRAINERS)
            return edl_errf(why, whylen, EDL_EPROTO, "a barrier of %u trainers (1..%d)",
                            r->trainers, PS_MAX_SYNC_TRAINERS);
        return 0;
    }
    if (h->len != PS_GEO_PULL_BYTES)
        return edl_errf(why, whylen, EDL_EPROTO, "a GEO pull of %u bytes, not %d", h->len,
                        PS_GEO_PULL_BYTES);
    r->trainer = edl_get32(b);
    r->max = edl_get32(b + 4);
    if (r->trainer >= EDL_PS_MAX_GEO_TRAINERS || r->max < 1)
        return edl_errf(why, whylen, EDL_EPROTO, "a GEO pull for trainer %u of at most %u rows "
                        "(trainers 0..%d, at least one row)", r->trainer, r->max,
                        EDL_PS_MAX_GEO_TRAINERS - 1);
    return 0;
}

/* A push's prefixes: its identity, then its mode's (PS_F_SYNC, PS_F_GEO): read into r, and
 * their length into *pre. */
static int parse_prefix(const ps_hdr *h, const uint8_t *b, ps_request *r, size_t *pre,
                        char *why, size_t whylen)
{
    bool push = h->type == PS_PUSH_SPARSE || h->type == PS_PUSH_DENSE;
    *pre = 0;
    if (h->flags && (!push || (h->flags != PS_F_SYNC && h->flags != PS_F_GEO) ||
                     (h->flags == PS_F_GEO && h->type != PS_PUSH_SPARSE)))
        return edl_errf(why, whylen, EDL_EPROTO, "flags %#x on a request of type %u (sync: "
                        "pushes; GEO: sparse pushes)", h->flags, h->type);
    if (!push)
        return 0;
    size_t mode = h->flags == PS_F_SYNC ? PS_SYNC_PREFIX : h->flags ? PS_GEO_PREFIX : 0;
    *pre = PS_ID_PREFIX + mode;
    if (h->len < *pre)
        return edl_errf(why, whylen, EDL_EPROTO, "a %spush of %u bytes (its prefixes take %zu)",
                        h->flags == PS_F_SYNC ? "sync " : h->flags ? "GEO " : "", h->len, *pre);
    r->id = (ps_push_id){edl_get64(b), edl_get64(b + 8)};
    r->gen = edl_get64(b + 16);
    b += PS_ID_PREFIX;
    if (h->flags == PS_F_SYNC) {
        r->token = edl_get64(b);
        r->step = edl_get64(b + 8);
    } else if (h->flags == PS_F_GEO && (r->trainer = edl_get32(b)) >= EDL_PS_MAX_GEO_TRAINERS) {
        return edl_errf(why, whylen, EDL_EPROTO, "a GEO push from trainer %u (0..%d)",
                        r->trainer, EDL_PS_MAX_GEO_TRAINERS - 1);
    }
    return 0;
}

/* PUT_SHARD: gen(8) shard(4) 0(4) config then the shard's bytes (ps_table_shard_export's). */
static int parse_put_shard(const ps_hdr *h, const uint8_t *b, ps_request *r, char *why,
                           size_t whylen)
{
    if (h->len < PS_PUT_PREFIX)
        return edl_errf(why, whylen, EDL_EPROTO, "a shard hand-over of %u bytes (at least %d)",
                        h->len, PS_PUT_PREFIX);
    r->gen = edl_get64(b);
    r->shard = edl_get32(b + 8);
    int rc = ps_config_parse(b + 16, &r->cfg, why, whylen);
    if (rc == 0 && r->shard >= r->cfg.shards)
        rc = edl_errf(why, whylen, EDL_EPROTO, "shard %u of a table of %u", r->shard,
                      r->cfg.shards);
    r->values = b + PS_PUT_PREFIX;
    r->total = h->len - PS_PUT_PREFIX;
    return rc;
}

int ps_request_parse(const ps_hdr *h, const uint8_t *body, ps_request *out, char *why,
                     size_t whylen)
{
    ps_request r = {.h = *h};
    size_t pre;
    int rc = parse_prefix(h, body, &r, &pre, why, whylen);
    if (rc)
        return rc;
    ps_hdr in = *h; /* the body after the prefix */
    in.len -= (uint32_t)pre;
    body += pre;
    switch (h->type) {
    case PS_CREATE:
        if (h->len != PS_CONFIG_BYTES)
            return edl_errf(why, whylen, EDL_EPROTO, "a table config of %u bytes, not %d",
                            h->len, PS_CONFIG_BYTES);
        rc = ps_config_parse(body, &r.cfg, why, whylen);
        break;
    case PS_PULL_SPARSE:
    case PS_PUSH_SPARSE: rc = parse_sparse(&in, body, &r, why, whylen); break;
    case PS_PULL_DENSE:
    case PS_PUSH_DENSE: rc = parse_dense(&in, body, &r, why, whylen); break;
    case PS_STATS:
        if (h->len != 0)
            return edl_errf(why, whylen, EDL_EPROTO, "a stats request with a body");
        break;
    case PS_BARRIER:
    case PS_GEO_PULL: rc = parse_barrier(h, body, &r, why, whylen); break;
    case PS_PUT_SHARD: rc = parse_put_shard(h, body, &r, why, whylen); break;
    case PS_SHRINK:
        if (h->len != PS_SHRINK_BYTES)
            return edl_errf(why, whylen, EDL_EPROTO, "a shrink of %u bytes, not %d", h->len,
                            PS_SHRINK_BYTES);
        r.token = edl_get64(body);
        break;
    case PS_SAVE:
        if (h->len != PS_SAVE_BYTES)
            return edl_errf(why, whylen, EDL_EPROTO, "a save of %u bytes, not %d", h->len,
                            PS_SAVE_BYTES);
        r.step = edl_get64(body);
        r.gen = edl_get64(body + 8);
        r.rank = edl_get32(body + 16);
        r.world = edl_get32(body + 20);
        if (r.world < 1 || r.world > EDL_PS_MAX_SERVERS || r.rank >= r.world ||
            r.step > (uint64_t)EDL_GENERATION_MAX)
            return edl_errf(why, whylen, EDL_EPROTO, "a save of step %llu as server %u of %u",
                            (unsigned long long)r.step, r.rank, r.world);
        break;
    default:
        return edl_errf(why, whylen, EDL_EPROTO, "unknown request type %u", h->type);
    }
    if (rc == 0 && h->table >= EDL_PS_MAX_TABLES)
        rc = edl_errf(why, whylen, EDL_EPROTO, "table id %u (0..%d)", h->table,
                      EDL_PS_MAX_TABLES - 1);
    if (rc == 0)
        *out = r;
    return rc;
}

/* ---- configs and stats --------------------------------------------------------------------- */

void ps_config_encode(const edl_ps_table_config *c, uint8_t out[PS_CONFIG_BYTES])
{
    memset(out, 0, PS_CONFIG_BYTES);
    out[0] = (uint8_t)c->kind;
    out[1] = (uint8_t)c->optimizer;
    out[2] = (uint8_t)c->init;
    out[3] = (uint8_t)c->geo_trainers;
    edl_put32(out + 4, c->dim);
    edl_put64(out + 8, c->size);
    edl_put32(out + 16, c->shards);
    put_float(out + 20, c->lr);
    put_float(out + 24, c->beta1);
    put_float(out + 28, c->beta2);
    put_float(out + 32, c->eps);
    put_float(out + 36, c->init_scale);
    edl_put64(out + 40, c->seed);
    out[48] = (uint8_t)c->accessor;
    out[49] = (uint8_t)c->replicas;
    if (c->accessor != EDL_PS_ACCESSOR_CTR)
        return; /* a plain table's ctr fields are zeros: they mean nothing */
    put_float(out + 52, c->ctr.nonclk_coeff);
    put_float(out + 56, c->ctr.click_coeff);
    put_float(out + 60, c->ctr.embedx_threshold);
    put_float(out + 64, c->ctr.show_click_decay_rate);
    put_float(out + 68, c->ctr.delete_threshold);
    edl_put32(out + 72, c->ctr.delete_after_unseen_days);
}

/* The bytes a config must leave zero: after the accessor, after the ctr fields, and (plain
 * tables) the ctr fields. */
static bool config_zeros(const uint8_t *p)
{
    static const uint8_t zero[24];
    return !p[50] && !p[51] && !edl_get32(p + 76) &&
           (p[48] == EDL_PS_ACCESSOR_CTR || !memcmp(p + 52, zero, sizeof zero));
}

int ps_config_parse(const uint8_t *p, edl_ps_table_config *out, char *why, size_t whylen)
{
    edl_ps_table_config c = {.kind = p[0], .optimizer = p[1], .init = p[2], .geo_trainers = p[3],
                             .dim = edl_get32(p + 4), .size = edl_get64(p + 8),
                             .shards = edl_get32(p + 16), .lr = get_float(p + 20),
                             .beta1 = get_float(p + 24), .beta2 = get_float(p + 28),
                             .eps = get_float(p + 32), .init_scale = get_float(p + 36),
                             .seed = edl_get64(p + 40), .accessor = p[48], .replicas = p[49],
                             .ctr = {.nonclk_coeff = get_float(p + 52),
                                     .click_coeff = get_float(p + 56),
                                     .embedx_threshold = get_float(p + 60),
                                     .show_click_decay_rate = get_float(p + 64),
                                     .delete_threshold = get_float(p + 68),
                                     .delete_after_unseen_days = edl_get32(p + 72)}};
    int rc = edl_ps_table_config_check(&c, why, whylen);
    if (rc == 0 && !config_zeros(p))
        rc = edl_errf(why, whylen, EDL_EPROTO, "a table config whose unused bytes are not "
                      "zero (accessor %u)", p[48]);
    if (rc == 0)
        *out = c;
    return rc == 0 ? 0 : EDL_EPROTO;
}

bool ps_config_equal(const edl_ps_table_config *a, const edl_ps_table_config *b)
{
    uint8_t x[PS_CONFIG_BYTES], y[PS_CONFIG_BYTES];
    edl_ps_table_config a1 = *a, b1 = *b;
    a1.geo_trainers = a->geo_trainers > 0; /* GEO or not; the count may grow */
    b1.geo_trainers = b->geo_trainers > 0;
    ps_config_encode(&a1, x);
    ps_config_encode(&b1, y);
    return memcmp(x, y, sizeof x) == 0;
}

void ps_stats_encode(const edl_ps_server_stats *s, uint8_t out[PS_STATS_BYTES])
{
    const uint64_t v[PS_STATS_BYTES / 8] = {s->tables, s->rows, s->bytes, s->requests,
                                            s->errors, s->connections, s->rejected,
                                            s->shards_in, s->shards_out, s->shards_lost,
                                            s->shards_restored, s->pushes};
    for (int i = 0; i < PS_STATS_BYTES / 8; i++)
        edl_put64(out + 8 * i, v[i]);
}

void ps_stats_parse(const uint8_t *p, edl_ps_server_stats *out)
{
    uint64_t v[PS_STATS_BYTES / 8];
    for (int i = 0; i < PS_STATS_BYTES / 8; i++)
        v[i] = edl_get64(p + 8 * i);
    *out = (edl_ps_server_stats){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9],
                                 v[10], v[11]};
}
