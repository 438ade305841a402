/* server.h: the parameter server's state: its network side's (server.c), with the elastic side's
 * (elastic.c and mover.c: the map of servers, which shards this one owns, hand-overs) and the
 * checkpoint side's (checkpoint.c) each in a struct of its own, that only its files touch;
 * the other sides use its functions below. Internal to ps/. */
#ifndef EDL_PS_SERVER_H
#define EDL_PS_SERVER_H

#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"

#define PS_MAX_THREADS 64

/* A copy of a shard this server holds, for a server that holds it too from a new map on. */
typedef struct ps_copy {
    uint16_t table;
    uint32_t shard;
    char to[256]; /* its name */
} ps_copy;

/* The elastic side (elastic.c, mover.c): this server's place in the map. Requests hold
 * `route` for reading while they touch tables (ps_elastic_read_lock); map changes and
 * hand-overs hold it for writing. Without a map (mapped false) every shard is served. */
typedef struct ps_elastic {
    pthread_rwlock_t route;
    bool mapped, joining;
    int64_t gen;
    int nserv, self;              /* self: this server's index in the map; -1: leaving */
    char **names, **eps;
    uint8_t *own[EDL_PS_MAX_TABLES]; /* per shard: PS_SH_* */
    int64_t pending_until[EDL_PS_MAX_TABLES]; /* monotonic ms: when unreceived shards start anew */
    ps_copy *copies;              /* copies for new backups (replicas > 1), by the mover */
    size_t ncopies, capcopies;
    pthread_t mover;              /* hands over the shards held but not owned */
    bool mover_started, mover_stop;
    pthread_mutex_t mover_mu;
    pthread_cond_t mover_cv;
} ps_elastic;

/* The checkpoint side (checkpoint.c): the job's PS checkpoints. */
typedef struct ps_checkpoint {
    bool on;
    edl_ckpt_config cfg;          /* its strings are copies */
    pthread_mutex_t mu;
    edl_ckpt *ck;                 /* opened for rank of world (NULL: not yet) */
    int rank, world;
    edl_ckpt_pending *saves[8];   /* uploads in flight, checked by the mover */
} ps_checkpoint;

struct edl_ps_server {
    edl_ps_server_options o;
    char job[256], addr[256];
    edl_job_secret secret;
    int lfd, port, stop_fd, nthreads;
    pthread_t th[PS_MAX_THREADS];
    bool started;
    pthread_mutex_t create_mu;
    ps_table *_Atomic tables[EDL_PS_MAX_TABLES];
    ps_sync *sync[PS_BARRIER_SPACES]; /* sync steps (with sums); the workers' barrier */
    int wake_fd[PS_MAX_THREADS]; /* per loop: a sync step is done, answer the waiting */
    int hand_fd[PS_MAX_THREADS][2]; /* per loop: a pipe of the sockets accepted for it */
    atomic_uint next_loop;          /* the loop for the next connection, round robin */
    atomic_uint_fast64_t requests, errors, connections, rejected;
    atomic_int live;                /* authenticated connections (max_connections) */
    /* refusals, logged at most once a second (report_refusals in server.c) */
    atomic_uint_fast64_t n_evicted, n_timed_out, n_refused;
    atomic_int_fast64_t report_at;  /* monotonic ms: the next report is due then */
    pthread_mutex_t why_mu;
    char last_why[256];             /* the last refusal's reason */
    atomic_uint_fast64_t shards_in, shards_out, shards_lost, pushes;
    ps_elastic el;                /* elastic.c and mover.c only */
    ps_checkpoint cp;             /* checkpoint.c only */
    atomic_uint_fast64_t shards_restored;
    /* sparse keys served, for /metrics only: not in edl_ps_server_stats, whose bytes are
     * the STATS answer's wire format */
    atomic_uint_fast64_t keys_pulled, keys_pushed;
};


/* A shard's state on this server. */
enum { PS_SH_OWN = 0,  /* owned and here: served */
       PS_SH_AWAY,     /* not owned, not here */
       PS_SH_HELD,     /* not owned but here: to be handed to its owner */
       PS_SH_PENDING,  /* owned, not here yet: its old owner hands it over */
       PS_SH_RESTORE }; /* owned, not here: to load from the newest checkpoint (or start anew) */

/* server.c */
int ps_server_create_table(edl_ps_server *s, uint16_t id, const edl_ps_table_config *cfg,
                           char *why, size_t whylen);

/* elastic.c */
void ps_elastic_init(edl_ps_server *s);
void ps_elastic_close(edl_ps_server *s);
bool ps_elastic_mapped(edl_ps_server *s); /* a map was given */
/* The read side of the route lock: held by a request that touches tables, or by a snapshot. */
void ps_elastic_read_lock(edl_ps_server *s);
void ps_elastic_read_unlock(edl_ps_server *s);
/* Under the read lock: the PS_SH_* state of each shard of table id (NULL: no map, every shard
 * is served). */
const uint8_t *ps_elastic_states(edl_ps_server *s, uint16_t id);
/* Under the read lock: shard sh of table id is this server's to save (its owner, and here). */
bool ps_elastic_saves(edl_ps_server *s, uint16_t id, uint32_t sh);
/* A shard of table id to restore from a checkpoint (state PS_SH_RESTORE): imported from blob
 * and served from then on. 0; EDL_ECONFLICT when it is not waiting for a restore (nothing done);
 * else the import's error with why. Takes the route lock for writing. */
int ps_elastic_restore_shard(edl_ps_server *s, ps_table *t, uint16_t id, uint32_t sh,
                             const uint8_t *blob, size_t len, char *why, size_t whylen);
/* The states of a new table's shards, from the map. EDL_ENOMEM. */
int ps_elastic_table_new(edl_ps_server *s, uint16_t id, ps_table *t);
/* Under the read lock: 0 when this server serves every shard a request touches; else
 * EDL_EMOVED or EDL_EBUSY with why. */
int ps_route_check(edl_ps_server *s, const ps_request *r, const ps_table *t, char *why,
                   size_t whylen);
/* Under the route lock: the names of the servers that hold shard sh of t in the newest map
 * (owner first), their number returned; whether `who` is one of them. */
int ps_elastic_holders(edl_ps_server *s, const ps_table *t, uint32_t sh,
                       char names[EDL_PS_MAX_REPLICAS][256]);
bool ps_elastic_holds(edl_ps_server *s, const ps_table *t, uint32_t sh, const char *who);
/* A shard handed over by another server (PUT_SHARD). */
int ps_serve_put_shard(edl_ps_server *s, const ps_request *r, char *why, size_t whylen);

/* mover.c: the thread that sends shards to the servers that hold them (started by the first
 * map). */
void *ps_mover_main(void *arg);

/* checkpoint.c */
int ps_ckpt_init(edl_ps_server *s, const edl_ckpt_config *cfg);
bool ps_ckpt_enabled(const edl_ps_server *s); /* the job has checkpoint storage */
void ps_ckpt_close(edl_ps_server *s);
/* SAVE: snapshot the owned shards and queue their upload. */
int ps_serve_save(edl_ps_server *s, const ps_request *r, char *why, size_t whylen);
/* Log and forget the uploads that finished (the mover calls it). */
void ps_ckpt_reap(edl_ps_server *s);
/* Load the shards (table, shard) of the list from the newest checkpoint: done[i] set for
 * each one loaded (its state made PS_SH_OWN). */
typedef struct ps_due {
    uint16_t table;
    uint32_t shard;
    bool timed_out; /* its hand-over never came (lost unless the checkpoint has it) */
    bool done;
} ps_due;
/* from: which checkpoint they came from ("PS checkpoint <dir> (step N)"), "" when none. */
void ps_ckpt_restore(edl_ps_server *s, ps_due *due, size_t n, char *from, size_t fromlen);

#endif
