/* internal.h: what the files of libedlcoll share. comm.c owns the communicator (generations,
 * etcd rendezvous, re-forming), net.c the TCP mesh and the message engine, algo.c the
 * collective algorithms on top of it, auth.c the link handshake's frames and MACs, dtype.c the
 * reduction kernels, state.c the commit / restore / sync helper. */
#ifndef EDL_COLL_INTERNAL_H
#define EDL_COLL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "edl/collective.h"
#include "edl/etcd.h"
#include "edl/job.h"
#include "edl/secret.h"

#ifdef EDL_HAVE_NCCL
#include "nccl_backend.h"
#else
typedef struct coll_nccl coll_nccl;
#endif

#define COLL_MAGIC 0x43444c45u /* "EDLC" on the wire (little endian) */
#define COLL_HELLO_MAGIC 0x48444c45u /* "EDLH" */
#define COLL_CHALLENGE_MAGIC 0x41444c45u /* "EDLA" */
#define COLL_PROOF_MAGIC 0x50444c45u /* "EDLP" */
#define COLL_READY_MAGIC 0x52444c45u /* "EDLR" */
#define COLL_PROTO_VERSION 2 /* 2: every link authenticated with the job secret */
#define COLL_NONCE_BYTES 16
#define COLL_HELLO_BYTES 56

enum coll_kind {
    COLL_ALLREDUCE = 1,
    COLL_BROADCAST,
    COLL_ALLGATHER,
    COLL_REDUCE_SCATTER,
    COLL_BARRIER,
};

/* Every message on the wire starts with this header (little-endian hosts only; the hello
 * refuses others). The receiver checks it against what it expects, which is how a mismatch
 * of collectives across ranks is detected rather than corrupting memory. */
typedef struct coll_hdr {
    uint32_t magic;
    uint8_t kind, dtype, op, pad;
    uint64_t seq;   /* collective number within the generation */
    uint64_t count; /* the caller's count */
    uint32_t len;   /* payload bytes that follow */
    int32_t root;
} coll_hdr;

/* What one collective is: the template for its headers and the message for a mismatch. */
typedef struct coll_op {
    enum coll_kind kind;
    edl_dtype dt;
    edl_redop op;
    size_t count;
    int root;
    uint64_t seq;
} coll_op;

/* ---- the link handshake (auth.c: pure, no I/O) ------------------------------------------
 * On every link of every generation (see docs/collective.md):
 *   connector -> acceptor  hello     version, generation, from, to, size, token, nonce_c
 *   acceptor -> connector  challenge nonce_a, MAC(CHALLENGE)
 *   connector -> acceptor  proof     MAC(PROOF)
 * and at the end of the join, each side of every link sends ready: MAC(READY_*). Every MAC is
 * HMAC-SHA256 under the job secret of (tag, kind, job key prefix, hello, nonce_a). */
typedef struct coll_hello {
    uint16_t version;
    int64_t generation;
    int32_t from, to, size;
    uint64_t token; /* the token the acceptor published for this generation */
    uint8_t nonce[COLL_NONCE_BYTES]; /* the connector's */
} coll_hello;

/* A link's transcript: what every MAC on it is bound to. */
typedef struct coll_link {
    coll_hello h;
    uint8_t nonce_a[COLL_NONCE_BYTES]; /* the acceptor's */
} coll_link;

/* The address a connector reached a lower rank at: a link that broke before that rank's ready
 * frame is made again there (net.c, coll_verify_links). */
typedef struct coll_addr {
    struct sockaddr_storage sa;
    socklen_t len;
} coll_addr;

enum coll_mac_kind {
    COLL_MAC_CHALLENGE = 1,   /* from the acceptor */
    COLL_MAC_PROOF,           /* from the connector */
    COLL_MAC_READY_CONNECTOR, /* the join's link check, each way */
    COLL_MAC_READY_ACCEPTOR,
};

void coll_hello_encode(const coll_hello *h, uint8_t out[COLL_HELLO_BYTES]);
/* Parse the first len bytes of a hello: 0 = complete and well formed (*out set), 1 = a good
 * prefix, more bytes needed, EDL_EPROTO (why set) = not an edl hello of this version or
 * impossible numbers. Does not judge whether it fits this rank's generation. */
int coll_hello_parse(const void *buf, size_t len, coll_hello *out, char *why, size_t whylen);
/* The challenge (magic, nonce, MAC), proof and ready frames (magic, MAC). */
size_t coll_frame_bytes(uint32_t magic);
void coll_frame_encode(uint32_t magic, const uint8_t *nonce, const uint8_t *mac, uint8_t *out);
/* 0 = complete (nonce, for a challenge, and mac set), 1 = more bytes needed, EDL_EPROTO. */
int coll_frame_parse(const void *buf, size_t len, uint32_t magic, uint8_t *nonce, uint8_t *mac);
/* The MAC of one frame of a link (job: the job's key prefix). 0, or EDL_EINVAL. */
int coll_link_mac(const edl_job_secret *s, const char *job, const coll_link *l,
                  enum coll_mac_kind kind, uint8_t out[EDL_SECRET_MAC_BYTES]);

struct edl_comm {
    /* configuration */
    char backend[8];
    int timeout_ms, rdv_timeout_ms, device;
    size_t seg_bytes;     /* most bytes staged before they are reduced */
    size_t small_bytes;   /* at or below: latency-optimal algorithms */
    size_t io_bytes;      /* most bytes per send()/recv() of data that is not reduced */
    size_t block_bytes;   /* ring allreduce: a slice is n blocks of about this size */
    size_t window_bytes;  /* a stream sends at most this far ahead of what it received; 0: the
                           * default of the link (coll_window) */
    edl_agent_link *link; /* to the agent: generations in, steps out */
    bool own_link;
    edl_etcd *etcd;       /* NULL: a group of one, no rendezvous */
    edl_job_keys keys;    /* the job's keys (gen/<n>/... is the rendezvous) */
    char listen_addr[256];
    int lfd, lport;       /* one listening socket for the life of the process */
    edl_job_secret secret; /* authenticates every link (len 0: none; only a group of one) */

    /* the current generation */
    int64_t gen;
    int rank, size;
    int *fds;             /* [size] sockets to each peer, -1 for self */
    coll_link *links;     /* [size] each link's handshake transcript */
    coll_addr *addrs;     /* [size] where this rank connected to each lower rank */
    uint64_t seq;
    int64_t call_start_ms; /* when the collective in progress began (monotonic) */
    int call_kind;        /* and which it is (enum coll_kind) */
    bool wait_reported;   /* its wait was reported to the agent ("blocked"): say when it ends */
    bool broken;          /* a collective failed: only edl_coll_check() helps */
    bool dead_seen;       /* the generation's dead key was seen (no need to publish it) */
    edl_watch *dead_watch; /* on gen/<n>/dead */
    bool *peer_local;     /* [size] the rank listens on this process's host address */
    int local_ranks;      /* ranks on this host, this one included */

    /* a newer generation read from the control pipe, not joined yet */
    bool have_next;
    int64_t next_gen;
    int next_rank, next_size;
    bool agent_gone;
    bool first_check;     /* the first edl_coll_check() reports a re-form (initial sync) */

    /* the previous communicator, for the NCCL shrink fast path */
    int64_t prev_gen;
    int prev_rank;
    coll_nccl *nccl;
    int64_t nccl_gen;     /* the generation nccl was built for, and this rank in it */
    int nccl_rank;

    /* work buffers, grown and kept (never allocated per call on the hot path) */
    char *stage;
    size_t stage_cap;
    char *work;
    size_t work_cap;
    char *plan;           /* the blocks of a stream (coll_blk) */
    size_t plan_cap;

    char err[1024];
};

/* comm.c */
void coll_set_err(edl_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The collective in progress waits on peer (-1: unknown): after COLL_WAIT_REPORT_MS, tell the
 * agent once per call (its hang detection; see edl_agent_link_report_blocked). Cheap: call it
 * whenever the engine is about to sleep. */
#define COLL_WAIT_REPORT_MS 1000
void coll_note_wait(edl_comm *c, int peer);
/* A collective failed: break the communicator, close every socket (so peers blocked on this
 * rank fail at once too) and publish the generation dead. Returns rc. */
int coll_fail(edl_comm *c, int rc);
void *coll_stage(edl_comm *c, size_t bytes); /* NULL: out of memory */
void *coll_work(edl_comm *c, size_t bytes);
struct coll_blk *coll_plan(edl_comm *c, int nb); /* NULL: out of memory; not zeroed */

/* Drain the watch on gen/<n>/: 1 (and c->err set) once the dead key has appeared. */
int coll_dead_announced(edl_comm *c);

/* net.c */
const char *coll_kind_name(int kind); /* "allreduce", ... */
int coll_listen(edl_comm *c);
void coll_close_peers(edl_comm *c);
/* Connect the mesh of generation c->gen: to every lower rank, accept every higher one, each
 * link authenticated by the handshake. eps[i]: "addr:port" of rank i, tokens[i]: the token
 * rank i published. */
int coll_connect_mesh(edl_comm *c, char **eps, const uint64_t *tokens, uint64_t my_token,
                      int64_t deadline_ms);
/* The join's barrier: every rank sends an authenticated ready frame on every link and
 * receives one on every link, so a bad link anywhere in the mesh fails the join. */
int coll_verify_links(edl_comm *c, int64_t deadline_ms);
/* Send slen bytes to `to` while receiving rlen bytes from `from` (either may be -1), each as
 * one message with a header made from op: a stream of one block. */
int coll_sendrecv(edl_comm *c, const coll_op *op, int to, const void *sbuf, size_t slen,
                  int from, void *rbuf, size_t rlen);
/* Judge a header received from rank `from` against the collective this rank runs (op) and
 * the payload it expects (rlen): 0, or EDL_EPROTO with the mismatch in c->err. */
int coll_check_header(edl_comm *c, const coll_op *op, int from, const coll_hdr *h, size_t rlen);
/* A stream on one link of a ring or chain: send block j goes to `to` while receive block j
 * comes from `from` (either may be -1), all behind one header. A received block lands in dst,
 * or with red in the stage and then dst = red op stage (scaled for an average with scale).
 * A send block with dep >= 0 forwards receive block dep: it goes out only as far as that has
 * been received (and reduced). A receive block with wait_sent >= 0 shares its buffer with
 * data that send block wait_sent carries: it is written only as far as that has gone out.
 * Sends stay at most a window ahead of receives (coll_window). A send block with copy also
 * lands there, slen bytes, each piece copied right after it went out (from cache). */
typedef struct coll_blk {
    const char *src; /* send block j: slen bytes */
    size_t slen;
    char *copy;      /* NULL, or where the bytes sent also go */
    char *dst;       /* receive block j: rlen bytes */
    const char *red;
    size_t rlen;
    int dep, wait_sent;
    bool scale;
} coll_blk;

typedef struct coll_stream {
    int to, from;
    const coll_blk *b;
    int nb;
    bool no_window; /* one message each way (coll_sendrecv): nothing gained by holding back */
} coll_stream;

int coll_stream_run(edl_comm *c, const coll_op *op, const coll_stream *st);

/* algo.c */
int coll_cpu_allreduce(edl_comm *c, const coll_op *op, const void *send, void *recv);
int coll_cpu_broadcast(edl_comm *c, const coll_op *op, const void *send, void *recv);
int coll_cpu_allgather(edl_comm *c, const coll_op *op, const void *send, void *recv);
int coll_cpu_reduce_scatter(edl_comm *c, const coll_op *op, const void *send, void *recv);

/* dtype.c */
const char *coll_redop_name(edl_redop op);
void coll_reduce(void *dst, const void *a, const void *b, size_t n, edl_dtype dt, edl_redop op);
void coll_scale_avg(void *buf, size_t n, edl_dtype dt, int world);
float coll_half_to_float(uint16_t h);
uint16_t coll_float_to_half(float f);
float coll_bf16_to_float(uint16_t b);
uint16_t coll_float_to_bf16(float f);

/* state.c uses the CPU group directly, whatever the back end. */
int coll_cpu_allreduce_host(edl_comm *c, const void *send, void *recv, size_t count,
                            edl_dtype dt, edl_redop op);
int coll_cpu_broadcast_host(edl_comm *c, void *buf, size_t bytes, int root);

/* The host (host.c): cores this process may use, one core's L2 (l2_known false: sysfs did not
 * say, and 1 MiB is assumed), read once. The default window of a link between ranks on this host
 * (for local_ranks of them) and the default block of the sliced ring allreduce follow from them. */
typedef struct coll_host {
    int cores;
    size_t l2_bytes;
    bool l2_known;
} coll_host;

const coll_host *coll_host_get(void);
size_t coll_local_window(const coll_host *h, int local_ranks);
size_t coll_default_block(const coll_host *h);

#endif
