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
#define PS_PROTO_VERSION 1
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
 * header: magic "EDLP"(4) type(1) 0(1) table(2) id(4) body length(4), then the body. A reply
 * has the request's type | PS_REPLY (or PS_ERROR), table and id. Bodies (little-endian):
 *   CREATE       table config (PS_CONFIG_BYTES)                  -> empty
 *   PULL_SPARSE  n(4) 0(4) keys(8n)                               -> n(4) dim(4) rows(4 n dim)
 *   PUSH_SPARSE  n(4) dim(4) keys(8n) gradients(4 n dim)          -> empty
 *   PULL_DENSE   nseg(4) 0(4) {offset(8) count(8)} x nseg         -> values(4 sum count)
 *   PUSH_DENSE   nseg(4) 0(4) {offset(8) count(8)} x nseg values  -> empty
 *   STATS        empty                                            -> 7 counters(8 each)
 *   ERROR        code(4, an EDL_E* value) message(len - 4, at most PS_MAX_ERROR) */
#define PS_FRAME_MAGIC 0x504c4445u /* "EDLP" */
#define PS_HDR_BYTES 16
#define PS_CONFIG_BYTES 48
#define PS_STATS_BYTES 56
#define PS_MAX_ERROR 512
#define PS_REPLY 0x80

enum ps_type {
    PS_CREATE = 1,
    PS_PULL_SPARSE = 2,
    PS_PUSH_SPARSE = 3,
    PS_PULL_DENSE = 4,
    PS_PUSH_DENSE = 5,
    PS_STATS = 6,
    PS_ERROR = 0xff,
};

typedef struct ps_hdr {
    uint8_t type;
    uint16_t table;
    uint32_t id, len;
} ps_hdr;

void ps_hdr_encode(const ps_hdr *h, uint8_t out[PS_HDR_BYTES]);
/* 0; EDL_EPROTO (not a frame) or EDL_ETOOBIG (len > max_body), with the reason in why. */
int ps_hdr_parse(const uint8_t *p, uint32_t max_body, ps_hdr *out, char *why, size_t whylen);

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
    const uint8_t *values;   /* PUSH_*: gradients */
} ps_request;

/* 0, or EDL_EPROTO / EDL_ETOOBIG / EDL_EINVAL with the reason in why. */
int ps_request_parse(const ps_hdr *h, const uint8_t *body, ps_request *out, char *why,
                     size_t whylen);
void ps_segment_get(const uint8_t *segs, uint32_t i, uint64_t *off, uint64_t *count);
void ps_segment_put(uint8_t *segs, uint32_t i, uint64_t off, uint64_t count);

void ps_config_encode(const edl_ps_table_config *c, uint8_t out[PS_CONFIG_BYTES]);
int ps_config_parse(const uint8_t *p, edl_ps_table_config *out, char *why, size_t whylen);
bool ps_config_equal(const edl_ps_table_config *a, const edl_ps_table_config *b);

void ps_stats_encode(const edl_ps_server_stats *s, uint8_t out[PS_STATS_BYTES]);
void ps_stats_parse(const uint8_t *p, edl_ps_server_stats *out);

/* ---- tables (table.c) ----------------------------------------------------------------------
 * A table's shards each have their own lock: requests on different shards never wait for each
 * other. Sparse rows are created on first touch; dense shards on first touch of the shard. */
typedef struct ps_table ps_table;

int ps_table_new(const edl_ps_table_config *cfg, ps_table **out);
void ps_table_free(ps_table *t);
const edl_ps_table_config *ps_table_config(const ps_table *t);
/* keys: n little-endian ids; out: n * dim floats. EDL_ENOMEM leaves earlier rows in place. */
int ps_table_pull_sparse(ps_table *t, const uint8_t *keys, uint32_t n, float *out);
int ps_table_push_sparse(ps_table *t, const uint8_t *keys, uint32_t n, const uint8_t *grads);
/* [off, off + n) within the table (the caller checked). */
int ps_table_pull_dense(ps_table *t, uint64_t off, uint64_t n, float *out);
int ps_table_push_dense(ps_table *t, uint64_t off, uint64_t n, const uint8_t *grads);
void ps_table_stats(ps_table *t, uint64_t *rows, uint64_t *bytes);

/* splitmix64's finaliser: the key's hash for shards and initial values. */
static inline uint64_t ps_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#endif
