/* internal.h: libedlps's private parts: the wire protocol (proto.c: pure encoders and parsers
 * that a fuzzer can call), the tables (table.c) and the shard arithmetic the client and the
 * server share. The wire format is specified in docs/ps.md; this file is its code. */
#ifndef EDL_PS_INTERNAL_H
#define EDL_PS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "edl/ps.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the parameter server's wire carries keys and floats in host order, little-endian"
#endif

/* ---- the link handshake ------------------------------------------------------------------
 * client -> server  hello:     magic "EDLS"(4) version(2) 0(2) client nonce(16)
 * server -> client  challenge: magic "EDLS"(4) version(2) 0(2) server nonce(16) MAC(32)
 * client -> server  proof:     magic "EDLS"(4) version(2) 0(2) MAC(32)
 * Each MAC is HMAC-SHA256 under the job secret of a domain tag, its direction, the job id and
 * both nonces: the server proves the secret first, to a nonce the client chose, then the
 * client to the server's. A server that refuses a hello answers with an error frame. */
#define PS_LINK_MAGIC 0x534c4445u /* "EDLS" */
#define PS_PROTO_VERSION 2 /* 2: push identities, configs of 80 bytes (the accessor), SHRINK */
#define PS_NONCE_BYTES 16
#define PS_HELLO_BYTES 24
#define PS_CHALLENGE_BYTES 56
#define PS_PROOF_BYTES 40

enum ps_mac_dir { PS_MAC_SERVER = 1, PS_MAC_CLIENT = 2 };

void ps_hello_encode(const uint8_t nonce[PS_NONCE_BYTES], uint8_t out[PS_HELLO_BYTES]);
/* Parsers of the handshake: 0, or EDL_EPROTO with the reason (not edl, other version). */
int ps_hello_parse(const uint8_t *p, size_t len, uint8_t nonce[PS_NONCE_BYTES], char *why,
                   size_t whylen);
void ps_challenge_encode(const uint8_t nonce[PS_NONCE_BYTES], const uint8_t *mac,
                         uint8_t out[PS_CHALLENGE_BYTES]);
int ps_challenge_parse(const uint8_t *p, size_t len, uint8_t nonce[PS_NONCE_BYTES],
                       uint8_t *mac, char *why, size_t whylen);
void ps_proof_encode(const uint8_t *mac, uint8_t out[PS_PROOF_BYTES]);
int ps_proof_parse(const uint8_t *p, size_t len, uint8_t *mac, char *why, size_t whylen);
int ps_link_mac(const edl_job_secret *s, const char *job, enum ps_mac_dir dir,
                const uint8_t nc[PS_NONCE_BYTES], const uint8_t ns[PS_NONCE_BYTES],
                uint8_t *out);

/* ---- frames --------------------------------------------------------------------------------
 * header: magic "EDLP"(4) type(1) flags(1) table(2) id(4) body length(4), then the body. A
 * reply has the request's type | PS_REPLY (or PS_ERROR), table and id. Bodies (little-endian):
 *   CREATE       table config (PS_CONFIG_BYTES)                  -> empty
 *   PULL_SPARSE  n(4) 0(4) keys(8n)                               -> n(4) dim(4) rows(4 n dim)
 *   PUSH_SPARSE  n(4) w(4) keys(8n) rows(4 n w)                   -> empty
 *                w is the table's push width (ps_push_width): dim gradients a key for a plain
 *                table; show, click and dim gradients (dim + 2) for a CTR table
 *   PULL_DENSE   nseg(4) 0(4) {offset(8) count(8)} x nseg         -> values(4 sum count)
 *   PUSH_DENSE   nseg(4) 0(4) {offset(8) count(8)} x nseg values  -> empty
 *   STATS        empty                                            -> 7 counters(8 each)
 *   BARRIER      token(8) step(8) trainers(4) generation(4)       -> applied(4) 0(4) done(8)
 *                generation: the workers' (0: none); a later one drops the step in progress
 *   GEO_PULL     trainer(4) max rows(4)              -> n(4) dim(4) more(4) 0(4) keys rows
 *   PUT_SHARD    map generation(8) shard(4) 0(4) table config(PS_CONFIG_BYTES) the shard's
 *                bytes (server to server: a shard handed to its new owner)  -> empty
 *   SAVE         step(8) generation(8) rank(4) servers(4): snapshot the owned shards for a
 *                PS checkpoint                                        -> empty (snapshotted)
 *   SHRINK       token(8): a CTR table's shrink step on the shards served here; a token the
 *                table has shrunk for already is answered again, not applied again
 *                                                              -> evicted(8) rows left(8)
 *   ERROR        code(4, an EDL_E* value) message(len - 4, at most PS_MAX_ERROR)
 * Every push body starts with its identity, client token(8) sequence(8), and the client's map
 * generation(8) (PS_ID_PREFIX): a server applies a push once whatever how often it comes, and
 * only from a client on its own map. Then flags, on pushes only: PS_F_SYNC (sync mode: a
 * prefix token(8) step(8), and the gradients wait for the step's barrier) or PS_F_GEO
 * (sparse: a prefix trainer(4) 0(4), and the values are deltas, added as they are). */
#define PS_FRAME_MAGIC 0x504c4445u /* "EDLP" */
#define PS_HDR_BYTES 16
/* a config: the 48 bytes of version 1, accessor(1) replicas(1) 0(2), the ctr fields(24), 0(4) */
#define PS_CONFIG_BYTES 80
#define PS_SHRINK_BYTES 8
#define PS_SHRINK_REPLY_BYTES 16
#define PS_CTR_MAX_UNSEEN (1u << 30)
#define PS_STATS_BYTES 96
#define PS_SAVE_BYTES 24
#define PS_PUT_PREFIX (16 + PS_CONFIG_BYTES)
#define PS_MAX_ERROR 512
#define PS_REPLY 0x80
#define PS_F_SYNC 1
#define PS_F_GEO 2
#define PS_ID_PREFIX 24
#define PS_SYNC_PREFIX 16
#define PS_GEO_PREFIX 8
#define PS_BARRIER_BYTES 24
#define PS_BARRIER_REPLY_BYTES 16
#define PS_GEO_PULL_BYTES 8
#define PS_GEO_PULL_PREFIX 16
#define PS_MAX_SYNC_TRAINERS 65536

enum ps_type {
    PS_CREATE = 1,
    PS_PULL_SPARSE = 2,
    PS_PUSH_SPARSE = 3,
    PS_PULL_DENSE = 4,
    PS_PUSH_DENSE = 5,
    PS_STATS = 6,
    PS_BARRIER = 7,
    PS_GEO_PULL = 8,
    PS_PUT_SHARD = 9,
    PS_SAVE = 10,
    PS_SHRINK = 11,
    PS_ERROR = 0xff,
};

typedef struct ps_hdr {
    uint8_t type, flags;
    uint16_t table;
    uint32_t id, len;
} ps_hdr;

void ps_hdr_encode(const ps_hdr *h, uint8_t out[PS_HDR_BYTES]);
/* 0; EDL_EPROTO (not a frame) or EDL_ETOOBIG (len > max_body), with the reason in why. */
int ps_hdr_parse(const uint8_t *p, uint32_t max_body, ps_hdr *out, char *why, size_t whylen);

/* A push's identity: its client's token and the push's sequence number (growing per client).
 * Each shard applies a given push once, however often it arrives (a retry, a replica); NULL:
 * always applied (the server's own sums, a trainer's local tables). */
typedef struct ps_push_id {
    uint64_t token, seq;
} ps_push_id;

/* ---- what a shard remembers of its clients' pushes (dedup.c) -------------------------------
 * Per client (token) the last push applied (seq) and the request it came in (req, numbered
 * over the server's life); PS_DEDUP_MAX clients, then the least recently used is forgotten. */
#define PS_DEDUP_MAX 4096

typedef struct ps_applied {
    uint64_t token, seq, req, used; /* used: when it last applied (LRU order) */
} ps_applied;

typedef struct ps_dedup {
    ps_applied *slot; /* cap slots (a power of two, or 0), by token; seq 0: empty */
    uint32_t n, cap;  /* entries, slots (n <= cap / 2) */
} ps_dedup;

/* Whether push id may apply (the caller holds the shard's lock; NULL: always); a client seen
 * first is remembered. Out of memory it applies (the push is not lost; a duplicate of it
 * could apply twice). req: the request's number (its runs of keys on one shard all apply). */
bool ps_dedup_admit(ps_dedup *d, const ps_push_id *id, uint64_t req);
/* Hint the cache line where id's entry would be (ahead of the shard's lock and admission). */
void ps_dedup_prefetch(const ps_dedup *d, const ps_push_id *id);
/* Shard copies and checkpoints: 16 bytes a client (token, seq), least recently used first;
 * ps_dedup_get fills an empty d, in that order (EDL_EPROTO past PS_DEDUP_MAX, for a push
 * numbered 0 or a client named twice; EDL_ENOMEM). */
size_t ps_dedup_bytes(const ps_dedup *d);
void ps_dedup_put(const ps_dedup *d, uint8_t *p);
int ps_dedup_get(ps_dedup *d, const uint8_t *p, uint32_t n);
void ps_dedup_free(ps_dedup *d);

/* A request's body, checked: counts agree with the length, every count within the limits.
 * The arrays point into the body (keys and values little-endian, maybe unaligned). */
typedef struct ps_request {
    ps_hdr h;
    edl_ps_table_config cfg; /* CREATE */
    uint32_t n, dim;         /* sparse: keys; PUSH: floats per row */
    const uint8_t *keys;
    uint32_t nseg;           /* dense: segments */
    const uint8_t *segs;
    uint64_t total;          /* dense: elements over all segments */
    const uint8_t *values;   /* PUSH_*: gradients (GEO: deltas) */
    uint64_t token, step;    /* PS_F_SYNC pushes and BARRIER: the trainer and its step;
                                SHRINK: its token */
    uint32_t trainers;       /* BARRIER: trainers in the step */
    uint32_t members_gen;    /* BARRIER: the workers' generation (0: none) */
    uint32_t trainer, max;   /* PS_F_GEO pushes and GEO_PULL: the trainer; GEO_PULL: rows */
    uint64_t gen;            /* the sender's map generation: pushes, PUT_SHARD, SAVE */
    ps_push_id id;           /* pushes */
    uint32_t shard;          /* PUT_SHARD (cfg: its table; values, total: its bytes) */
    uint32_t rank, world;    /* SAVE (step: the checkpoint's) */
} ps_request;

/* 0, or EDL_EPROTO / EDL_ETOOBIG / EDL_EINVAL with the reason in why. */
int ps_request_parse(const ps_hdr *h, const uint8_t *body, ps_request *out, char *why,
                     size_t whylen);
void ps_segment_get(const uint8_t *segs, uint32_t i, uint64_t *off, uint64_t *count);
void ps_segment_put(uint8_t *segs, uint32_t i, uint64_t off, uint64_t count);

void ps_config_encode(const edl_ps_table_config *c, uint8_t out[PS_CONFIG_BYTES]);
int ps_config_parse(const uint8_t *p, edl_ps_table_config *out, char *why, size_t whylen);
/* The same table: every field alike, but geo_trainers only as to GEO or not (a GEO table
 * tracks the most trainers any create named: ps_table_track_geo). */
bool ps_config_equal(const edl_ps_table_config *a, const edl_ps_table_config *b);
/* Floats a key in a sparse push to a table of this config (shard.c): dim, or dim + 2 (CTR). */
uint32_t ps_push_width(const edl_ps_table_config *c);

void ps_stats_encode(const edl_ps_server_stats *s, uint8_t out[PS_STATS_BYTES]);
void ps_stats_parse(const uint8_t *p, edl_ps_server_stats *out);

/* ---- tables (table.c) ----------------------------------------------------------------------
 * A table's shards each have their own lock: requests on different shards never wait for each
 * other. Sparse rows are created on first touch; dense shards on first touch of the shard. */
typedef struct ps_table ps_table;

int ps_table_new(const edl_ps_table_config *cfg, ps_table **out);
void ps_table_free(ps_table *t);
const edl_ps_table_config *ps_table_config(const ps_table *t);
/* A GEO table's trainers, and raising them (a create that names more: a job that grew; never
 * lowered, so that a trainer index stays valid). Safe beside requests. */
uint32_t ps_table_geo_trainers(const ps_table *t);
bool ps_table_track_geo(ps_table *t, uint32_t trainers);
/* keys: n little-endian ids; out: n * dim floats. EDL_ENOMEM leaves earlier rows in place. */
int ps_table_pull_sparse(ps_table *t, const uint8_t *keys, uint32_t n, float *out);
int ps_table_push_sparse(ps_table *t, const uint8_t *keys, uint32_t n, const uint8_t *grads,
                         const ps_push_id *id);
/* [off, off + n) within the table (the caller checked). */
int ps_table_pull_dense(ps_table *t, uint64_t off, uint64_t n, float *out);
int ps_table_push_dense(ps_table *t, uint64_t off, uint64_t n, const uint8_t *grads,
                        const ps_push_id *id);
void ps_table_stats(ps_table *t, uint64_t *rows, uint64_t *bytes);
/* GEO (cfg.geo_trainers > 0): add n deltas of `trainer` and mark their rows changed for every
 * other trainer; take (and unmark) up to max rows changed for `trainer` since it last took,
 * their keys (little-endian) and rows; *more when some are left. */
int ps_table_geo_add(ps_table *t, const uint8_t *keys, uint32_t n, const uint8_t *deltas,
                     uint32_t trainer, const ps_push_id *id);
uint32_t ps_table_geo_take(ps_table *t, uint32_t trainer, uint32_t max, uint8_t *keys,
                           float *rows, bool *more);
/* Moving a shard (elastic servers): its rows and optimizer state (and GEO change bits) as
 * bytes, malloc'ed (drop: and the shard emptied, under the same lock); those bytes into an
 * empty shard s of another server's table (EDL_EPROTO with why for bytes that do not fit
 * this table or shard; the shard stays empty); a shard emptied. */
int ps_table_shard_export(ps_table *t, uint32_t s, bool drop, uint8_t **out, size_t *len);
int ps_table_shard_import(ps_table *t, uint32_t s, const uint8_t *p, size_t len, char *why,
                          size_t whylen);
void ps_table_shard_drop(ps_table *t, uint32_t s);
bool ps_table_shard_empty(ps_table *t, uint32_t s); /* no row (sparse), never touched (dense) */
/* A row for its only user (no lock: the trainer's own tables), created when asked; NULL when
 * absent or out of memory. */
float *ps_table_row(ps_table *t, uint64_t key, bool create);
/* Empty a merge buffer for its next round, keeping its memory: no rows (sparse), zeros (dense;
 * for tables whose optimizer has no state). */
void ps_table_reset(ps_table *t);
/* fn on every shard's rows under its lock: sparse, n rows of `stride` floats with their keys;
 * dense, the n elements from `start` (keys NULL, stride 1). Stops at fn's first nonzero. */
typedef int (*ps_rows_fn)(void *arg, const uint64_t *keys, uint64_t start, float *rows,
                          size_t n, size_t stride);
int ps_table_foreach(ps_table *t, ps_rows_fn fn, void *arg);
/* Push every row (sparse) or element (dense) of sum, an SGD table without state, into target
 * as one gradient: a sync step's gradients, summed, applied once. */
int ps_table_apply_to(ps_table *sum, ps_table *target);
/* The config of a table that sums pushes to tables of cfg (a sync step's sums, a trainer's
 * merge buffer): plain, SGD with lr -1 from zero rows (a push adds), rows as wide as a push
 * (ps_push_width). */
void ps_sum_config(const edl_ps_table_config *cfg, edl_ps_table_config *out);
/* A CTR table's shrink step (edl_ps_shrink) on the shards for which serves(arg, shard) says
 * true (serves NULL: all): *evicted rows deleted, *left rows kept. A token equal to the last
 * one's shrinks nothing and gives the last counts again (a retried call). */
int ps_table_shrink(ps_table *t, uint64_t token, bool (*serves)(void *arg, uint32_t shard),
                    void *arg, uint64_t *evicted, uint64_t *left);

/* ---- the client's calls for the modes (client.c, used by trainer.c) ---------------------------- */
typedef struct ps_call_mode {
    uint8_t flags;       /* PS_F_SYNC or PS_F_GEO; 0: a plain call */
    uint8_t prefix[PS_SYNC_PREFIX];
    size_t len;          /* of the prefix */
} ps_call_mode;
int ps_client_push_sparse_mode(edl_ps_client *c, uint32_t table, const uint64_t *keys,
                               size_t n, const float *grads, const ps_call_mode *m);
int ps_client_push_dense_mode(edl_ps_client *c, uint32_t table, uint64_t off, uint64_t n,
                              const float *grads, const ps_call_mode *m);
/* Who arrives at a barrier: the trainer's token, and its workers' generation (0: none). */
typedef struct ps_arrival {
    uint64_t token;
    uint32_t generation;
} ps_arrival;
/* Every server's barrier of step in space (PS_SPACE_*): *applied when every server has applied
 * it; *done the least of their applied steps. */
int ps_client_barrier(edl_ps_client *c, uint32_t space, const ps_arrival *who, uint64_t step,
                      uint32_t trainers, bool *applied, uint64_t *done);
/* Ask the barrier of step again until every server has applied it (each "not yet" answer, after
 * PS_SYNC_POLL_MS, is followed by the question again with trainers(arg), the count in force
 * then); step UINT64_MAX asks once where the servers are. *done as ps_client_barrier's. */
int ps_client_wait_barrier(edl_ps_client *c, uint32_t space, const ps_arrival *who, uint64_t step,
                           uint32_t (*trainers)(void *arg), void *arg, uint64_t *done);
/* The rows changed for trainer since its last GEO pull, from every server, each handed to
 * fn(arg, key, row) (dim floats). */
int ps_client_geo_pull(edl_ps_client *c, uint32_t table, uint32_t trainer,
                       void (*fn)(void *arg, uint64_t key, const float *row), void *arg);
/* Hand shard `shard` of a table (its bytes from ps_table_shard_export) to the one server of
 * c, under map gen. 0 once it has it; EDL_EBUSY / EDL_EMOVED when it cannot take it now. */
int ps_client_put_shard(edl_ps_client *c, uint32_t table, const edl_ps_table_config *cfg,
                        uint32_t shard, int64_t gen, const uint8_t *blob, size_t len);
/* How a call is cut over a client's links (client.c; bench/ps moves the same bytes the same
 * way for its echo bound): a call of at least PS_LANE_MIN_KEYS keys (or PS_LANE_MIN_FLOATS
 * floats) per link goes on every lane of its servers, a smaller one on their first lanes; a big
 * dense range goes in pieces of about PS_DENSE_PIECE floats a link, one after the other. */
#define PS_LANE_MIN_KEYS 1024
#define PS_LANE_MIN_FLOATS (64u << 10)
#define PS_DENSE_PIECE (256u << 10)
/* The connections c has to each server (its lanes). */
int ps_client_lanes(const edl_ps_client *c);
/* The config a client knows a table by (after edl_ps_create_table); NULL otherwise. */
const edl_ps_table_config *ps_client_table(const edl_ps_client *c, uint32_t table);
/* A second client to c's servers, with c's options and map (its own links and push token):
 * the async sender's, so that its pushes and the trainer's pulls do not wait for each other. */
int ps_client_clone(const edl_ps_client *c, edl_ps_client **out, char *why, size_t whylen);
/* Take a table that another client created on the servers as known (no request). EDL_ENOMEM. */
int ps_client_know_table(edl_ps_client *c, uint32_t table, const edl_ps_table_config *cfg);

/* ---- pulls ahead of need (prefetch.c) -------------------------------------------------------- */
typedef struct ps_prefetch ps_prefetch;
/* A thread and a client (a clone of c) that pull rows ahead. */
int ps_prefetch_open(const edl_ps_client *c, ps_prefetch **out, char *why, size_t whylen);
void ps_prefetch_close(ps_prefetch *p);
/* Pull keys of table (config cfg) now, in the background; the table's last one is replaced
 * (after it is off the wire). EDL_ENOMEM. */
int ps_prefetch_start(ps_prefetch *p, uint32_t table, const edl_ps_table_config *cfg,
                      const uint64_t *keys, size_t n);
/* Bytes its client sent and received (edl_ps_client_traffic), once no pull is on the wire. */
void ps_prefetch_traffic(ps_prefetch *p, uint64_t *sent, uint64_t *received);
/* When the table's pull ahead is of these keys: wait for it (then it is used up), and on
 * success copy its rows (n * dim floats) into out: true. False (none of these keys, or it
 * failed): pull them yourself. */
bool ps_prefetch_take(ps_prefetch *p, uint32_t table, const uint64_t *keys, size_t n,
                     float *out, uint32_t dim);

/* ---- sync mode (sync.c) --------------------------------------------------------------------- */
#define PS_SYNC_POLL_MS 200 /* a waiting barrier is answered "not yet" after this */
/* A BARRIER's table field names its space: sync mode's steps, or the workers' own barrier
 * (edl_fleet_barrier_worker), counted apart. */
enum { PS_SPACE_STEPS = 0, PS_SPACE_WORKERS = 1, PS_BARRIER_SPACES = 2 };
typedef struct ps_sync ps_sync;
int ps_sync_new(ps_sync **out);
void ps_sync_free(ps_sync *y);
/* A PS_F_SYNC push into its step's sums. EDL_ECONFLICT (why) for another step. */
int ps_sync_push(ps_sync *y, const ps_table *target, const ps_request *r, char *why,
                 size_t whylen);
/* A trainer at the barrier of r->step (UINT64_MAX: only asks where the server is): 1 the step
 * is applied (answer now), 2 this arrival completed it and the sums were applied to tables
 * (NULL: a barrier without sums) (answer, and wake the waiting), 0 wait, < 0 an error (why).
 * *done: the steps applied. */
int ps_sync_arrive(ps_sync *y, ps_table *_Atomic *tables, const ps_request *r, uint64_t *done,
                   char *why, size_t whylen);
bool ps_sync_applied(ps_sync *y, uint64_t step, uint64_t *done);
/* Shard sh of table id stops being served here mid-step: the step's sums for it so far are
 * applied to target now (early rather than lost; they leave with the shard's rows). */
void ps_sync_flush_shard(ps_sync *y, uint16_t id, ps_table *target, uint32_t sh);

/* ---- elastic servers under the agent (follow.c) ---------------------------------------------- */
#include <signal.h>
typedef struct ps_follow ps_follow;
struct edl_metrics_server;
/* From the agent's environment; EDL_ENOTFOUND when there is none (EDL_ETCD_ENDPOINTS unset:
 * a fixed set of servers), else EDL_ECONFIG with why. */
int ps_follow_open(ps_follow **out, char *why, size_t whylen);
void ps_follow_close(ps_follow *f);
/* A client's `servers` source: the job's newest map from etcd (1 when newer than newer_than). */
int ps_follow_read(void *arg, int64_t newer_than, edl_ps_servers *out);
const char *ps_follow_self(const ps_follow *f); /* EDL_POD_ID: this server's name in maps */
const edl_ckpt_config *ps_follow_checkpoint(const ps_follow *f); /* NULL: no checkpoints */
bool ps_follow_job_over(ps_follow *f);
/* Serve following the map until a signal reaches w (ps_waiter_open), then leave gracefully:
 * until a map without this server is published and every shard is handed over, the job is
 * over, or drain_timeout_ms. 0, or the signal when a second one came first. */
struct ps_waiter;
int ps_follow_serve(edl_ps_server *s, ps_follow *f, struct ps_waiter *w, int drain_timeout_ms);
#define PS_DRAIN_TIMEOUT_MS 60000

/* ---- /metrics (metrics.c) ------------------------------------------------------------------ */
struct edl_metrics_server;
struct edl_prom;
typedef struct ps_metrics_src {
    edl_ps_server *s;
    const char *job, *pod; /* the labels */
} ps_metrics_src;
/* The sparse keys pulled and pushed so far (server.c): /metrics' edl_ps_keys_total, kept out
 * of edl_ps_server_stats so that the STATS answer keeps its wire format. */
void ps_server_key_counts(edl_ps_server *s, uint64_t *pulled, uint64_t *pushed);
/* An edl_metrics_fn: the server's counters (arg: a ps_metrics_src). */
void ps_write_metrics(void *arg, struct edl_prom *p);
/* The main thread's loop (edl/loop.h): SIGTERM and SIGINT (blocked before any thread starts)
 * on its signalfd, and /metrics when on (edl_metrics_attach to loop). */
struct edl_loop;
typedef struct ps_waiter {
    struct edl_loop *loop;
    int sig;                /* arrived and not yet returned by ps_wait_signal (0: none) */
} ps_waiter;
int ps_waiter_open(ps_waiter *w); /* EDL_ENOMEM, EDL_EIO */
void ps_waiter_close(ps_waiter *w);
/* Turn the loop up to timeout_ms (-1: for ever) until a signal: the signal, or 0 when the time
 * passed. */
int ps_wait_signal(ps_waiter *w, int timeout_ms);

/* splitmix64's finaliser: the key's hash for shards and initial values. */
static inline uint64_t ps_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The shard of a key whose hash is h (edl_ps_key_shard): h % shards, a mask when shards is a
 * power of two (the default, 1,024), since a division per key shows in the servers' lookups. */
static inline uint32_t ps_hash_shard(uint64_t h, uint32_t shards)
{
    return (uint32_t)((shards & (shards - 1)) == 0 ? h & (shards - 1) : h % shards);
}

#endif
