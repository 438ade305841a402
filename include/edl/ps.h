/* ps.h: the parameter server (libedlps): sparse and dense tables split over servers, updated
 * on the server by an optimizer, reached by trainers through a client that batches requests
 * per server, de-duplicates keys and talks to every server at once.
 *
 * A table is cut into `shards` virtual shards (default 1,024): a sparse key belongs to shard
 * mix(key) % shards, a dense element to the shard whose range of the array holds it. Shards
 * are spread over the servers by rendezvous hashing on the servers' names (edl_ps_shard_owner),
 * so that adding or removing one of S servers moves about 1/S of them, not half.
 * Links are authenticated with the per-job secret (edl/secret.h), as the collective's are.
 * The wire protocol and its limits are in docs/ps.md. */
#ifndef EDL_PS_H
#define EDL_PS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "edl/checkpoint.h"
#include "edl/common.h"
#include "edl/secret.h"

#define EDL_PS_DEFAULT_SHARDS 1024
#define EDL_PS_MAX_SHARDS 65536
#define EDL_PS_MAX_TABLES 256     /* table ids 0..255 */
#define EDL_PS_MAX_DIM 4096       /* floats per sparse row */
#define EDL_PS_MAX_DENSE (1u << 30) /* floats in one dense table */
#define EDL_PS_DEFAULT_MAX_MESSAGE (64u << 20) /* bytes of one request or reply body */
#define EDL_PS_MAX_GEO_TRAINERS 64
#define EDL_PS_MAX_REPLICAS 3
#define EDL_PS_MAX_LANES 8 /* connections a client keeps to each server */

/* ---- tables -------------------------------------------------------------------------------- */

typedef enum edl_ps_table_kind { EDL_PS_DENSE = 1, EDL_PS_SPARSE = 2 } edl_ps_table_kind;
typedef enum edl_ps_optimizer { EDL_PS_SGD = 1, EDL_PS_ADAGRAD = 2, EDL_PS_ADAM = 3 } edl_ps_optimizer;
typedef enum edl_ps_init { EDL_PS_INIT_ZERO = 1, EDL_PS_INIT_UNIFORM = 2 } edl_ps_init;
/* What a sparse row holds besides its weights (docs/ps.md, "The CTR accessor"):
 *   plain  dim floats (and their optimizer state); pushes carry dim gradients a key;
 *   ctr    as Paddle's CtrCommonAccessor: show and click counts, the shrink rounds since the
 *          row was last pushed (unseen), embed_w (1 float) and, only once the row's score
 *          (show - click) nonclk_coeff + click click_coeff reaches embedx_threshold, embedx
 *          (dim - 1 floats), each with its optimizer state. A pull gives dim floats a key:
 *          embed_w then embedx (zeros while it does not exist); a push carries dim + 2 floats
 *          a key: show, click, then the dim gradients (embedx's ignored while it does not
 *          exist). edl_ps_shrink decays and evicts. Sparse tables of dim >= 2, not GEO. */
typedef enum edl_ps_accessor { EDL_PS_ACCESSOR_PLAIN = 0, EDL_PS_ACCESSOR_CTR = 1 } edl_ps_accessor;

typedef struct edl_ps_ctr_config {
    float nonclk_coeff;          /* score = (show - click) nonclk_coeff + click click_coeff */
    float click_coeff;
    float embedx_threshold;      /* embedx is created once the score reaches this */
    float show_click_decay_rate; /* each shrink multiplies show and click by this (0..1) */
    float delete_threshold;      /* ... then deletes the rows whose score is below this */
    uint32_t delete_after_unseen_days; /* ... or that no push touched for more than this many
                                          shrinks (Paddle counts days: one shrink a day) */
} edl_ps_ctr_config;

/* What a table is; every client that uses a table passes the same. A server refuses a create
 * whose config differs from the table it holds under that id. */
typedef struct edl_ps_table_config {
    edl_ps_table_kind kind;
    uint32_t dim;           /* sparse: floats per row (1..EDL_PS_MAX_DIM); dense: 1 */
    uint64_t size;          /* dense: floats in the table (1..EDL_PS_MAX_DENSE); sparse: 0 */
    uint32_t shards;        /* virtual shards (1..EDL_PS_MAX_SHARDS) */
    edl_ps_optimizer optimizer;
    float lr, beta1, beta2, eps; /* beta1/beta2: Adam only; eps: Adagrad and Adam */
    edl_ps_init init;       /* values of a row or element before its first update */
    float init_scale;       /* uniform: in [-init_scale, init_scale) */
    uint64_t seed;          /* the initial values are a function of (seed, key, column): the
                               same whichever server creates the row */
    uint32_t geo_trainers;  /* GEO mode (sparse tables): the trainers whose changes the server
                               tracks (1..EDL_PS_MAX_GEO_TRAINERS); 0 for the other modes. A
                               create of an existing GEO table may name another count: the
                               table tracks the most any create named (a job that grew) */
    edl_ps_accessor accessor; /* sparse tables: plain (default) or ctr */
    uint32_t replicas;      /* servers that apply each update of a shard (1..EDL_PS_MAX_REPLICAS;
                               default 1): its owner and replicas - 1 backups, so that a
                               server that dies loses no acknowledged update */
    edl_ps_ctr_config ctr;  /* ctr only (ignored, and sent as zeros, for plain tables) */
} edl_ps_table_config;

/* Defaults: sparse, dim 8, 1,024 shards, SGD with lr 0.01, beta1 0.9, beta2 0.999, eps 1e-8,
 * uniform init with scale 0.01, seed 0, one replica, the plain accessor, and for ctr Paddle's
 * defaults:
 * nonclk_coeff 0.1, click_coeff 1, embedx_threshold 10, show_click_decay_rate 0.98,
 * delete_threshold 0.8, delete_after_unseen_days 30. */
void edl_ps_table_config_init(edl_ps_table_config *cfg);
/* 0, or EDL_EINVAL with the first bad field named in why. */
int edl_ps_table_config_check(const edl_ps_table_config *cfg, char *why, size_t whylen);

/* ---- sharding ------------------------------------------------------------------------------ */

/* The shard of a sparse key; of a dense element. */
uint32_t edl_ps_key_shard(uint64_t key, uint32_t shards);
uint32_t edl_ps_dense_shard(uint64_t index, uint64_t size, uint32_t shards);
/* The first element of dense shard s, and its length. */
uint64_t edl_ps_dense_shard_start(uint64_t size, uint32_t shards, uint32_t s);
uint64_t edl_ps_dense_shard_len(uint64_t size, uint32_t shards, uint32_t s);
/* The server (index into names) that owns shard s: the highest hash of (name, s). Names are
 * the servers' stable identities (pod names); n >= 1. */
int edl_ps_shard_owner(const char *const *names, int n, uint32_t s);
/* The min(r, n) servers that hold shard s with r replicas, heaviest first: out[0] is the
 * owner (edl_ps_shard_owner), the others its backups, the next in line to own it. */
int edl_ps_shard_replicas(const char *const *names, int n, uint32_t s, int r, int *out);

/* ---- the server ---------------------------------------------------------------------------- */

typedef struct edl_ps_server edl_ps_server;

typedef struct edl_ps_server_options {
    const char *listen_addr;  /* default 127.0.0.1 */
    int port;                 /* 0: any free port (edl_ps_server_port says which) */
    int threads;              /* event loops; default min(edl_cpu_count(), 4) */
    const char *job;          /* bound into the link MACs: the job id (default "edl") */
    const edl_job_secret *secret; /* required: links are always authenticated */
    uint32_t max_message;     /* default EDL_PS_DEFAULT_MAX_MESSAGE */
    int max_connections;      /* authenticated connections (default 1024); a link that
                                 authenticates past it is refused (EDL_EBUSY) */
    int max_unauthenticated;  /* connections not authenticated yet, held apart from those
                                 (default 256); at the bound a newcomer closes the oldest */
    int handshake_timeout_ms; /* a connection that has not authenticated by then is closed
                                 (default 5,000) */
    int handover_timeout_ms;  /* elastic: a shard that becomes this server's and that no
                                 server hands over by then comes back from the newest PS
                                 checkpoint (shards_restored), or, without one, starts again
                                 from its initial values (shards_lost) (default 10,000) */
    bool wait_for_map;        /* elastic: answer EDL_EBUSY to everything but STATS until the
                                 first edl_ps_server_set_map */
    const edl_ckpt_config *checkpoint; /* PS checkpoints (NULL: none): uri, etcd, prefix and
                                 job (copied; etcd borrowed); rank and world size are set by
                                 each save (edl_ps_save) */
} edl_ps_server_options;

/* Bind and listen (the server does not serve until edl_ps_server_start). 0, or EDL_ECONFIG /
 * EDL_EIO with the reason in why. */
int edl_ps_server_open(const edl_ps_server_options *o, edl_ps_server **out, char *why,
                       size_t whylen);
int edl_ps_server_port(const edl_ps_server *s);
/* Start the event loops on threads of their own; returns at once. */
int edl_ps_server_start(edl_ps_server *s);
/* Ask the loops to stop (async-signal-safe) and, in _close, wait for them and free all. */
void edl_ps_server_stop(edl_ps_server *s);
void edl_ps_server_close(edl_ps_server *s);

/* ---- elastic servers -----------------------------------------------------------------------
 * The servers of a job and their numbered map: who they are (names, for edl_ps_shard_owner)
 * and where (endpoints). The job server publishes one with each generation; the servers and
 * the clients follow it:
 *   - a server serves the shards it owns in the newest map it has been given; a request for a
 *     shard it does not own is refused whole with EDL_EMOVED (the client re-routes on a newer
 *     map), and for a shard it owns but has not received yet with EDL_EBUSY (the client asks
 *     again shortly): a request is applied whole or not at all;
 *   - a server that holds a shard it no longer owns hands it to the owner (server to server),
 *     then forgets it; one that is not in the map at all is leaving: once it has handed every
 *     shard over it is drained (edl_ps_server_drained) and may exit;
 *   - a server that was in the map before and comes to own a shard waits handover_timeout_ms
 *     for it (its old owner is handing it over), then, when the old owner is dead, starts it
 *     from initial values (shards_lost). So does a server that joins a running job: `joining`.
 * Without a map a server serves every shard (a fixed set of servers). */
typedef struct edl_ps_servers {
    int64_t generation;           /* grows with every change */
    int n;                        /* 1..EDL_PS_MAX_SERVERS */
    const char *const *names;     /* stable identities (pod names) */
    const char *const *endpoints; /* "host:port" */
} edl_ps_servers;
#define EDL_PS_MAX_SERVERS 1024

/* Follow a map (ignored unless newer than the last). self: this server's name, absent from a
 * map that it leaves. joining: the first map of a server that joins a job whose servers hold
 * data already (its shards come from them). 0, EDL_EINVAL (a map that makes no sense), or
 * EDL_ENOMEM. */
int edl_ps_server_set_map(edl_ps_server *s, const edl_ps_servers *m, const char *self,
                          bool joining);
/* True when the server holds no shard it does not own (a leaving server: it may exit). */
bool edl_ps_server_drained(edl_ps_server *s);

/* What a server holds, for tests, metrics and the memory bound. */
typedef struct edl_ps_server_stats {
    uint64_t tables, rows, bytes;   /* rows: sparse rows; bytes: table memory */
    uint64_t requests, errors, connections, rejected; /* rejected: connections refused,
                                                          closed to make room or for not
                                                          authenticating in time, or cut for
                                                          breaking the protocol */
    uint64_t shards_in, shards_out; /* (table, shard)s received from and handed to servers */
    uint64_t shards_lost; /* shards this server came to own that nobody handed over within
                             handover_timeout_ms and no checkpoint held: they started again
                             from initial values */
    uint64_t shards_restored; /* such shards loaded from the newest PS checkpoint instead */
    uint64_t pushes;          /* push requests applied: updates that no restart recreates */
} edl_ps_server_stats;
void edl_ps_server_get_stats(edl_ps_server *s, edl_ps_server_stats *out);

/* ---- the client ---------------------------------------------------------------------------- */

typedef struct edl_ps_client edl_ps_client;

typedef struct edl_ps_client_options {
    const char *const *endpoints; /* "host:port" of every server */
    const char *const *names;     /* their identities for the shard map (NULL: the endpoints) */
    int n_servers;
    const char *job;              /* as the servers' (default "edl") */
    const edl_job_secret *secret; /* required */
    int timeout_ms;               /* one call's limit (default 30,000) */
    uint32_t max_message;         /* default EDL_PS_DEFAULT_MAX_MESSAGE */
    /* Connections to each server (1..EDL_PS_MAX_LANES; default min(edl_cpu_count(), 4), as
     * the server's loops). A big pull or push is cut by shard into a request per lane, so
     * that the server's loops work on it side by side; small calls go on the first lane. */
    int lanes;
    /* Elastic servers (NULL: a fixed set). The endpoints above are map `generation`; when a
     * server refuses a request (moved, busy) or its link breaks, the client asks servers()
     * for a newer map: 1 and *out filled (valid until the next call) when it has one, 0 when
     * not yet, < 0 on error. A client and the clients an edl_ps_trainer opens beside it (its
     * async sender's, its pulls ahead) call it one at a time. It re-routes, and sends again
     * only what was not applied, until the call's timeout. */
    int (*servers)(void *arg, int64_t newer_than, edl_ps_servers *out);
    void *servers_arg;
    int64_t generation;
} edl_ps_client_options;

/* Connect to and authenticate with every server. One client per thread. 0, or EDL_EUNAVAIL /
 * EDL_EAUTH / EDL_EPROTO with the reason in why. */
int edl_ps_client_open(const edl_ps_client_options *o, edl_ps_client **out, char *why,
                       size_t whylen);
void edl_ps_client_close(edl_ps_client *c);
/* The last failure of a call, for people: which server, what happened. */
const char *edl_ps_client_errmsg(const edl_ps_client *c);

/* Bytes of requests sent and replies received since open (the handshakes not counted). */
void edl_ps_client_traffic(const edl_ps_client *c, uint64_t *sent, uint64_t *received);
/* Create a table on every server, or check that the one there has this config. */
int edl_ps_create_table(edl_ps_client *c, uint32_t table, const edl_ps_table_config *cfg);
/* Rows of n keys (duplicates allowed) into out, n * dim floats, in the keys' order. A call
 * whose share for one server would pass max_message fails (EDL_ETOOBIG) before sending:
 * pull fewer keys per call (pushes are not cut, so that a key's gradients stay one update). */
int edl_ps_pull_sparse(edl_ps_client *c, uint32_t table, const uint64_t *keys, size_t n,
                       float *out);
/* Gradients of n keys (n * dim floats; a CTR table's n * (dim + 2): show, click, then the
 * gradients); the values of a repeated key are summed first and the sum is applied once.
 * Returns once every server has applied its part. */
int edl_ps_push_sparse(edl_ps_client *c, uint32_t table, const uint64_t *keys, size_t n,
                       const float *grads);
/* Elements [off, off + n) of a dense table into out; gradients of the same range. A range
 * bigger than max_message / 8 floats goes in pieces of that size. */
int edl_ps_pull_dense(edl_ps_client *c, uint32_t table, uint64_t off, uint64_t n, float *out);
int edl_ps_push_dense(edl_ps_client *c, uint32_t table, uint64_t off, uint64_t n,
                      const float *grads);
/* A PS checkpoint of step (through edl/checkpoint.h, on servers opened with a checkpoint
 * config): every server of the client's map snapshots the shards it owns, as rank i of n,
 * and uploads them in the background; server 0 commits the checkpoint once all have. Returns
 * once every server has its snapshot (updates after it are not in the checkpoint). A server
 * that later comes to own a shard nobody hands over (its owner died), or that starts with a
 * job whose checkpoint holds its tables, loads the shard from the newest checkpoint, whatever
 * the number of servers that saved it. */
int edl_ps_save(edl_ps_client *c, int64_t step);
/* Totals over every server (tables counts distinct ids once per server). */
int edl_ps_stats(edl_ps_client *c, edl_ps_server_stats *out);
/* A CTR table's shrink step, on every server: each row's show and click are multiplied by
 * show_click_decay_rate and its unseen count grows by one; the rows whose score is then below
 * delete_threshold, or whose unseen count passes delete_after_unseen_days, are deleted and
 * their memory (row and embedx) given back. *evicted (may be NULL): the rows deleted. A call
 * retried (elastic servers) shrinks each server once. EDL_EINVAL for a table that is not CTR. */
int edl_ps_shrink(edl_ps_client *c, uint32_t table, uint64_t *evicted);

/* ---- the trainer's side of the update modes --------------------------------------------------
 *   sync        every step, the gradients of all trainers are summed on the servers and applied
 *               once, at the step's barrier (edl_ps_trainer_step), which follows the generation:
 *               edl_ps_trainer_set_trainers with the new count lets a step finish without a
 *               trainer that left.
 *   async       pushes return at once; a sender thread sends what is queued, the gradients of a
 *               key queued more than once summed first; the servers apply on arrival.
 *   half_async  the trainer's threads push into one merge buffer; at edl_ps_trainer_step the
 *               last of `threads` to arrive sends it and all go on once it is applied; trainers
 *               never wait for each other.
 *   geo         the trainer trains a local copy of the rows it pulls (SGD with the table's lr)
 *               and keeps the last synced copy; every geo_every steps it pushes, for each row it
 *               changed, (local - synced) / trainers, adds that to its synced copy, and pulls
 *               the rows the other trainers changed, moving its local copy by (server - synced).
 *               Sparse tables created with geo_trainers = trainers; dense tables are pushed at
 *               once, as in async.
 * What each guarantees when trainers or servers come and go: docs/ps.md. */
typedef enum edl_ps_mode {
    EDL_PS_MODE_SYNC = 1,
    EDL_PS_MODE_ASYNC = 2,
    EDL_PS_MODE_HALF_ASYNC = 3,
    EDL_PS_MODE_GEO = 4,
} edl_ps_mode;

/* "sync", "async", "half_async" (or "half-async"), "geo". 0 or EDL_EINVAL. */
int edl_ps_mode_parse(const char *s, edl_ps_mode *out);
const char *edl_ps_mode_name(edl_ps_mode m);

typedef struct edl_ps_trainer edl_ps_trainer;

typedef struct edl_ps_trainer_options {
    edl_ps_mode mode;
    int trainer_id, trainers; /* this trainer's index, and how many (the generation's) */
    int threads;              /* half_async: the threads that push and step (default 1) */
    int geo_every;            /* geo: steps between syncs (default 10) */
    uint32_t generation;      /* the workers' generation (EDL_GENERATION under the agent; 0:
                                 none): the servers' barriers count the trainers of the latest
                                 one only, and refuse those of an earlier one */
} edl_ps_trainer_options;

/* The trainer's side on an open client (borrowed: close the trainer first). The tables must
 * have been created on this client. 0, or EDL_EINVAL / an error of the servers (why). */
int edl_ps_trainer_open(edl_ps_client *c, const edl_ps_trainer_options *o,
                        edl_ps_trainer **out, char *why, size_t whylen);
/* Pushes everything still queued (edl_ps_trainer_flush), then frees. */
int edl_ps_trainer_close(edl_ps_trainer *t);
const char *edl_ps_trainer_errmsg(const edl_ps_trainer *t);
/* As the client's, in the trainer's mode. Thread-safe in async and half_async; one thread in
 * sync and geo. */
int edl_ps_trainer_pull_sparse(edl_ps_trainer *t, uint32_t table, const uint64_t *keys,
                               size_t n, float *out);
int edl_ps_trainer_push_sparse(edl_ps_trainer *t, uint32_t table, const uint64_t *keys,
                               size_t n, const float *grads);
int edl_ps_trainer_pull_dense(edl_ps_trainer *t, uint32_t table, uint64_t off, uint64_t n,
                              float *out);
int edl_ps_trainer_push_dense(edl_ps_trainer *t, uint32_t table, uint64_t off, uint64_t n,
                              const float *grads);
/* async: the keys of a coming pull of table (the next batch's): they are pulled now, on a
 * client and thread of their own, while this batch computes; the next edl_ps_trainer_pull_sparse
 * of the same table and keys takes those rows (waiting for them if they are still on the way).
 * Such rows were read when the prefetch ran: they miss this trainer's pushes made since (one
 * batch's, in the usual loop), which async allows. Other modes: nothing (their pulls must see
 * every update the mode promises). 0, or EDL_EINVAL / EDL_ENOMEM. */
int edl_ps_trainer_prefetch_sparse(edl_ps_trainer *t, uint32_t table, const uint64_t *keys,
                                   size_t n);
/* The end of a training step (of this thread's batch, in half_async). */
int edl_ps_trainer_step(edl_ps_trainer *t);
/* Every push so far is applied on the servers (geo: the local changes are pushed now). */
int edl_ps_trainer_flush(edl_ps_trainer *t);
/* A new generation: this trainer's index and the trainer count (sync barriers, geo deltas). */
int edl_ps_trainer_set_trainers(edl_ps_trainer *t, int trainer_id, int trainers);
/* edl_ps_shrink through the trainer (it takes its turn on the client with the sender). CTR
 * tables train in sync, async and half_async (pushes of dim + 2 floats a key, merged the same
 * way: show and click are summed like gradients); geo refuses them (EDL_EINVAL): its trainers
 * train local copies of plain rows and keep no show/click statistics. */
int edl_ps_trainer_shrink(edl_ps_trainer *t, uint32_t table, uint64_t *evicted);
/* edl_ps_save through the trainer, after edl_ps_trainer_flush: the checkpoint holds every
 * update this trainer made before the call. */
int edl_ps_trainer_save(edl_ps_trainer *t, int64_t step);
/* Bytes sent and received by the trainer: its client's (edl_ps_client_traffic) and, in async
 * mode, those of the sender's and of the pulls ahead's own clients. Call it when no push is in
 * flight (after a flush). */
void edl_ps_trainer_traffic(edl_ps_trainer *t, uint64_t *sent, uint64_t *received);

/* ---- roles, as Paddle's Fleet gives them ------------------------------------------------------
 * edl_fleet_init reads the environment that Paddle's launchers (and edl's agent) give a
 * parameter-server job's processes:
 *   TRAINING_ROLE                  TRAINER or PSERVER
 *   PADDLE_PSERVERS_IP_PORT_LIST   the servers, "ip:port,ip:port"
 *   PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID   workers, and this worker's index
 *   POD_IP, PADDLE_PORT            where this server listens
 *   EDL_JOB_ID                     the job bound into the links (default "edl")
 *   EDL_JOB_SECRET_FILE            the job secret (or EDL_JOB_SECRET)
 *   EDL_PS_MODE                    sync, async (default), half_async or geo
 *   EDL_PS_GEO_EVERY               GEO: steps between syncs (default 10)
 *   EDL_PS_THREADS                 half_async: the trainer threads (default 1)
 *   EDL_PS_LANES                   connections to each server (edl_ps_client_options.lanes) */
typedef struct edl_fleet edl_fleet;

/* 0, or EDL_ECONFIG with the variable at fault named in why. */
int edl_fleet_init(edl_fleet **out, char *why, size_t whylen);
void edl_fleet_free(edl_fleet *f); /* stops the worker first if it runs */
bool edl_fleet_is_worker(const edl_fleet *f);
bool edl_fleet_is_server(const edl_fleet *f);
int edl_fleet_worker_index(const edl_fleet *f);
int edl_fleet_worker_num(const edl_fleet *f);
int edl_fleet_server_num(const edl_fleet *f);
const char *edl_fleet_server_endpoint(const edl_fleet *f, int i); /* NULL when out of range */
edl_ps_mode edl_fleet_mode(const edl_fleet *f);
/* The mode a program chose (Paddle's DistributedStrategy, edl.fleet's strategy) in place of
 * EDL_PS_MODE, EDL_PS_GEO_EVERY and EDL_PS_THREADS, before edl_fleet_init_worker; geo_every
 * and threads: 0 keeps the environment's. 0, or EDL_EINVAL (a value out of range, a worker
 * already started). */
int edl_fleet_set_mode(edl_fleet *f, edl_ps_mode mode, int geo_every, int threads);
/* The workers' generation (EDL_GENERATION, the one the agent started this worker for; 0 outside
 * the agent or for a server). */
uint32_t edl_fleet_generation(const edl_fleet *f);
/* A worker: connect to every server and open the trainer of the mode. Create the tables on
 * edl_fleet_client() before the first push. 0, or an error with the reason in why. */
int edl_fleet_init_worker(edl_fleet *f, char *why, size_t whylen);
edl_ps_client *edl_fleet_client(edl_fleet *f);
edl_ps_trainer *edl_fleet_trainer(edl_fleet *f);
/* Every worker waits here until all edl_fleet_worker_num() have arrived (through the servers,
 * counted apart from sync mode's steps). */
int edl_fleet_barrier_worker(edl_fleet *f);
/* Flush the trainer and close it and the client. */
int edl_fleet_stop_worker(edl_fleet *f);
/* A server: listen on POD_IP:PADDLE_PORT and serve until SIGTERM or SIGINT (blocked in the
 * calling thread while it waits). 0, or an error with the reason in why. */
int edl_fleet_run_server(edl_fleet *f, char *why, size_t whylen);

#endif
