/* edl/etcd.h: a client for etcd v3 over its JSON/HTTP gateway (libcurl + cJSON).
 *
 * Works against etcd 3.4 (Debian) and 3.5+: only `/v3/...` paths, 64-bit integers read from
 * JSON strings, zero-valued fields treated as omitted. Keys and values are binary-safe.
 *
 * A client (edl_etcd) holds one keep-alive connection and may be shared between threads (calls
 * are serialised). Lease keepers and watches open connections of their own, so a slow watch or
 * a keep-alive never waits behind a caller's request.
 *
 * Every call returns 0 or a negative EDL_E* code; edl_etcd_errmsg() then says what failed, on
 * which endpoint and for which key. */
#ifndef EDL_ETCD_H
#define EDL_ETCD_H

#include <stdbool.h>
#include <stdint.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- client ---------------------------------------------------------------------------- */

typedef struct edl_etcd edl_etcd;

typedef struct edl_etcd_config {
    char **endpoints;          /* "http://127.0.0.1:2379", "https://..."; tried in order */
    size_t n_endpoints;
    int64_t timeout_ms;        /* whole-call deadline, all fail-over attempts included (5000) */
    int64_t connect_timeout_ms; /* per connection attempt (1000) */
    int64_t max_response_bytes; /* larger replies fail with EDL_ETOOBIG (64 MiB) */
    char *ca_file;             /* TLS: CA bundle to verify servers (NULL: system default) */
    char *cert_file;           /* TLS client certificate (PEM), with key_file */
    char *key_file;
    char *username;            /* auth: when set, a token is fetched and renewed on expiry */
    char *password;
    char *password_file;       /* where password came from (edl_etcd_config_check reads it) */
} edl_etcd_config;

/* Fill with defaults and no endpoints. */
void edl_etcd_config_init(edl_etcd_config *cfg);
/* Replace the endpoint list with a comma-separated one ("http://a:2379,http://b:2379"). */
int edl_etcd_config_set_endpoints(edl_etcd_config *cfg, const char *csv);
/* Free what the config owns (endpoints and strings, all malloc'ed). */
void edl_etcd_config_clear(edl_etcd_config *cfg);

/* The client copies the config; the caller keeps its own. */
int edl_etcd_open(const edl_etcd_config *cfg, edl_etcd **out);
/* Shorthand: a client with default settings for a comma-separated endpoint list. */
int edl_etcd_open_endpoints(const char *endpoints_csv, edl_etcd **out);
void edl_etcd_close(edl_etcd *c);
/* What the last failed call on this client said: endpoint, key, server message. */
const char *edl_etcd_errmsg(const edl_etcd *c);
/* The endpoint the client now talks to. */
const char *edl_etcd_endpoint(const edl_etcd *c);

/* ---- the settings every program takes (etcd/options.c) ------------------------------------
 *
 * One table knows them: the flag, the environment variable and the config field. Programs put
 * EDL_ETCD_LONG_OPTIONS in their getopt_long table, hand every EDL_ETCD_OPT they get to
 * edl_etcd_config_set_option(), then call edl_etcd_config_from_env() (fills only what no flag
 * set: flags override the environment) and edl_etcd_config_check(). */

#define EDL_ETCD_OPT 0x4554 /* getopt_long's value for every entry of EDL_ETCD_LONG_OPTIONS */
#define EDL_ETCD_LONG_OPTIONS                                                                   \
    {"etcd", required_argument, 0, EDL_ETCD_OPT}, {"cacert", required_argument, 0, EDL_ETCD_OPT}, \
    {"cert", required_argument, 0, EDL_ETCD_OPT}, {"key", required_argument, 0, EDL_ETCD_OPT},     \
    {"user", required_argument, 0, EDL_ETCD_OPT},                                               \
    {"password-file", required_argument, 0, EDL_ETCD_OPT}
/* The environment that carries the same settings (what edl_etcd_config_env() sets). */
#define EDL_ETCD_ENV_NAMES                                                                      \
    "EDL_ETCD_ENDPOINTS", "EDL_ETCD_CACERT", "EDL_ETCD_CERT", "EDL_ETCD_KEY", "EDL_ETCD_USER",  \
        "EDL_ETCD_PASSWORD_FILE"
/* Their lines in a --help text. */
#define EDL_ETCD_OPTIONS_HELP                                                                   \
    "  --etcd URLS           etcd endpoints, comma-separated, http:// or https://\n"             \
    "                        ($EDL_ETCD_ENDPOINTS)\n"                                           \
    "  --cacert FILE         CA bundle that verifies etcd's certificate ($EDL_ETCD_CACERT)\n"    \
    "  --cert FILE           TLS client certificate, PEM, with --key ($EDL_ETCD_CERT)\n"         \
    "  --key FILE            the client certificate's private key ($EDL_ETCD_KEY)\n"             \
    "  --user NAME           etcd user name, with --password-file ($EDL_ETCD_USER)\n"            \
    "  --password-file FILE  the user's password: the file's one line\n"                        \
    "                        ($EDL_ETCD_PASSWORD_FILE)\n"

/* Set the setting of one flag ("etcd", "cacert", "cert", "key", "user", "password-file";
 * with or without the leading "--"). EDL_EINVAL with the reason in err for an unknown flag or
 * a bad endpoint list. */
int edl_etcd_config_set_option(edl_etcd_config *cfg, const char *flag, const char *value,
                               char *err, size_t errlen);
/* Fill every setting still unset from EDL_ETCD_ENDPOINTS, EDL_ETCD_CACERT, EDL_ETCD_CERT,
 * EDL_ETCD_KEY, EDL_ETCD_USER and EDL_ETCD_PASSWORD_FILE (empty variables count as unset). */
int edl_etcd_config_from_env(edl_etcd_config *cfg, char *err, size_t errlen);
/* The same from a NULL-terminated list of "NAME=value" entries (such as a file of them);
 * entries of other names are ignored. */
int edl_etcd_config_from_entries(edl_etcd_config *cfg, char *const *entries, char *err,
                                 size_t errlen);
/* Check the settings and finish them: certificate with key, user with a password file, every
 * file readable (paths made absolute, so a child in another directory finds them), the
 * password read from its file (one line, at most 1 KiB, a trailing newline dropped). Does not
 * require endpoints. EDL_EINVAL (or EDL_ENOMEM) with the reason in err. */
int edl_etcd_config_check(edl_etcd_config *cfg, char *err, size_t errlen);
/* The endpoints as one comma-separated list ("http://a:2379,http://b:2379"), the form of
 * --etcd and EDL_ETCD_ENDPOINTS; malloc'ed, NULL when out of memory. */
char *edl_etcd_config_endpoints(const edl_etcd_config *cfg);
/* The settings as "NAME=value" environment entries for a child (never the password itself,
 * only its file): NULL-terminated, malloc'ed, free with edl_env_free() (edl/proc.h). */
int edl_etcd_config_env(const edl_etcd_config *cfg, char ***out);
/* A client configured from the environment alone (from_env + check + open): what a trainer
 * under an agent uses. EDL_ENOTFOUND when EDL_ETCD_ENDPOINTS is unset. */
int edl_etcd_open_env(edl_etcd **out, char *err, size_t errlen);
/* What to check after a call failed with rc ("" when there is nothing to say): the flags and
 * variables that matter for an unreachable etcd or refused credentials. */
const char *edl_etcd_advice(int rc);

/* ---- key-values ------------------------------------------------------------------------ */

typedef struct edl_kv {
    char *key;   /* NUL-terminated for convenience; may contain NULs (use key_len) */
    size_t key_len;
    char *value; /* NUL-terminated for convenience; may contain NULs (use value_len) */
    size_t value_len;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t version;
    int64_t lease;
} edl_kv;

void edl_kv_free(edl_kv *kv); /* frees a heap edl_kv and its contents */

/* The end of the range that covers every key with this prefix (the prefix with its last byte
 * incremented; "\0" = all keys when the prefix is empty or all 0xff). Caller frees. */
int edl_etcd_prefix_end(edl_buf prefix, char **end, size_t *end_len);

typedef struct edl_put_opts {
    int64_t lease;     /* attach to this lease (0: none) */
    bool prev_kv;      /* return the previous key-value */
    bool ignore_value; /* keep the current value (refresh the lease) */
    bool ignore_lease; /* keep the current lease */
} edl_put_opts;

typedef struct edl_put_result {
    int64_t revision;  /* store revision after the put */
    edl_kv *prev_kv;   /* with prev_kv, when the key existed; owned by the result */
} edl_put_result;

/* opts and res may be NULL. */
int edl_etcd_put(edl_etcd *c, edl_buf key, edl_buf value, const edl_put_opts *opts,
                 edl_put_result *res);
void edl_put_result_clear(edl_put_result *r);

typedef enum edl_sort_order { EDL_SORT_NONE = 0, EDL_SORT_ASCEND, EDL_SORT_DESCEND } edl_sort_order;
typedef enum edl_sort_target {
    EDL_SORT_KEY = 0, EDL_SORT_VERSION, EDL_SORT_CREATE, EDL_SORT_MOD, EDL_SORT_VALUE
} edl_sort_target;

typedef struct edl_range_opts {
    bool prefix;          /* every key that starts with key */
    edl_buf range_end;    /* or an explicit end (exclusive); ignored when prefix */
    int64_t limit;        /* at most this many keys (0: no limit) */
    int64_t revision;     /* read at this revision (0: newest) */
    bool keys_only;
    bool count_only;
    edl_sort_order sort_order;
    edl_sort_target sort_target;
} edl_range_opts;

typedef struct edl_range_result {
    int64_t revision; /* store revision the read was served at */
    int64_t count;    /* keys in the range (may exceed n_kvs with a limit) */
    bool more;        /* a limit cut the answer */
    edl_kv *kvs;
    size_t n_kvs;
} edl_range_result;

int edl_etcd_range(edl_etcd *c, edl_buf key, const edl_range_opts *opts, edl_range_result *res);
void edl_range_result_clear(edl_range_result *r);
/* One key: EDL_ENOTFOUND when absent; *out is the caller's (edl_kv_free). rev may be NULL. */
int edl_etcd_get(edl_etcd *c, edl_buf key, edl_kv **out, int64_t *rev);

typedef struct edl_delete_opts {
    bool prefix;
    edl_buf range_end;
    bool prev_kv;
} edl_delete_opts;

typedef struct edl_delete_result {
    int64_t revision;
    int64_t deleted;
    edl_kv *prev_kvs;
    size_t n_prev_kvs;
} edl_delete_result;

int edl_etcd_delete(edl_etcd *c, edl_buf key, const edl_delete_opts *opts, edl_delete_result *res);
void edl_delete_result_clear(edl_delete_result *r);

/* ---- transactions ------------------------------------------------------------------------ */

typedef struct edl_txn edl_txn;

typedef enum edl_cmp_op { EDL_CMP_EQUAL = 0, EDL_CMP_GREATER, EDL_CMP_LESS, EDL_CMP_NOT_EQUAL } edl_cmp_op;
typedef enum edl_txn_branch { EDL_TXN_SUCCESS = 0, EDL_TXN_FAILURE = 1 } edl_txn_branch;

edl_txn *edl_txn_new(void); /* NULL only when out of memory */
void edl_txn_free(edl_txn *t);
/* Compares (all must hold for the success branch). Errors are kept and reported by edl_etcd_txn. */
void edl_txn_cmp_value(edl_txn *t, edl_buf key, edl_cmp_op op, edl_buf value);
void edl_txn_cmp_version(edl_txn *t, edl_buf key, edl_cmp_op op, int64_t version);
void edl_txn_cmp_create(edl_txn *t, edl_buf key, edl_cmp_op op, int64_t create_revision);
void edl_txn_cmp_mod(edl_txn *t, edl_buf key, edl_cmp_op op, int64_t mod_revision);
void edl_txn_cmp_lease(edl_txn *t, edl_buf key, edl_cmp_op op, int64_t lease);
/* Operations of a branch, run in order. */
void edl_txn_put(edl_txn *t, edl_txn_branch b, edl_buf key, edl_buf value, const edl_put_opts *o);
void edl_txn_range(edl_txn *t, edl_txn_branch b, edl_buf key, const edl_range_opts *o);
void edl_txn_delete(edl_txn *t, edl_txn_branch b, edl_buf key, const edl_delete_opts *o);

typedef enum edl_op_type { EDL_OP_RANGE = 0, EDL_OP_PUT, EDL_OP_DELETE } edl_op_type;

typedef struct edl_op_result {
    edl_op_type type;
    edl_range_result range;
    edl_put_result put;
    edl_delete_result del;
} edl_op_result;

typedef struct edl_txn_result {
    bool succeeded;          /* which branch ran */
    int64_t revision;
    edl_op_result *results;  /* one per op of the branch that ran, in order */
    size_t n_results;
} edl_txn_result;

int edl_etcd_txn(edl_etcd *c, const edl_txn *t, edl_txn_result *res);
void edl_txn_result_clear(edl_txn_result *r);

/* ---- leases ---------------------------------------------------------------------------- */

/* Grant a lease of ttl_s seconds (id 0: etcd picks). ttl_out (may be NULL): the granted TTL. */
int edl_etcd_lease_grant(edl_etcd *c, int64_t ttl_s, int64_t id, int64_t *id_out, int64_t *ttl_out);
/* One renewal. EDL_ELEASE when the lease is gone. */
int edl_etcd_lease_keepalive(edl_etcd *c, int64_t id, int64_t *ttl_out);
/* Revoke (deletes every key attached, in one revision). EDL_ENOTFOUND when unknown. */
int edl_etcd_lease_revoke(edl_etcd *c, int64_t id);
/* Revoke the lease that holds `key` (and with it every key attached): how whoever saw the
 * holder die says so before the lease runs out. EDL_ENOTFOUND when the key is absent or holds
 * no lease; lease_out (may be NULL): the lease revoked. */
int edl_etcd_lease_revoke_holder(edl_etcd *c, edl_buf key, int64_t *lease_out);
/* Remaining TTL (EDL_ENOTFOUND when gone); granted may be NULL. */
int edl_etcd_lease_ttl(edl_etcd *c, int64_t id, int64_t *ttl_out, int64_t *granted_out);

/* A lease keeper renews a lease in the background every TTL/3 on its own connection (retrying
 * sooner after a failed renewal) and reports, once, the moment the lease is lost: the server
 * says it expired, or no renewal succeeded for a whole TTL (judged on the local clock, so a
 * blocked network cannot hide the loss). Then the callback runs (on the keeper's thread) and,
 * once it has returned, the fd becomes readable. */
typedef struct edl_lease_keeper edl_lease_keeper;
typedef void (*edl_lease_lost_fn)(void *arg, int64_t lease, int reason /* EDL_E* */);

int edl_lease_keeper_open(edl_etcd *c, int64_t lease, int64_t ttl_s, edl_lease_lost_fn on_lost,
                           void *arg, edl_lease_keeper **out);
/* Readable (and stays readable) once the lease is lost. */
int edl_lease_keeper_fd(const edl_lease_keeper *k);
/* 0 while alive, else the EDL_E* reason it was lost. */
int edl_lease_keeper_status(const edl_lease_keeper *k);
int64_t edl_lease_keeper_lease(const edl_lease_keeper *k);
/* Stop renewing (the lease then expires by itself) and free; revoke = revoke it now too. */
void edl_lease_keeper_close(edl_lease_keeper *k, bool revoke);

/* ---- watch ----------------------------------------------------------------------------- */

typedef enum edl_watch_event_type {
    EDL_WATCH_PUT = 0,
    EDL_WATCH_DELETE,
    EDL_WATCH_PROGRESS,  /* no events up to `revision`: nothing was missed */
    EDL_WATCH_COMPACTED, /* events before compact_revision are gone: re-read, then continue */
    EDL_WATCH_ERROR,     /* the watch cannot go on (see error); it has stopped */
} edl_watch_event_type;

typedef struct edl_watch_event {
    edl_watch_event_type type;
    int64_t revision;         /* the event's mod_revision (PUT/DELETE) or header revision */
    edl_kv kv;                /* PUT/DELETE (a DELETE carries key and mod_revision only) */
    edl_kv *prev_kv;          /* with prev_kv, when there was one */
    int64_t compact_revision; /* COMPACTED */
    int error;                /* ERROR: EDL_E* */
} edl_watch_event;

typedef struct edl_watch_opts {
    bool prefix;
    edl_buf range_end;
    int64_t start_revision; /* 0: from now */
    bool prev_kv;
    bool progress_notify;   /* ask for progress events (the server's interval) */
    size_t max_queued;      /* events held for the caller before the stream is paused (4096) */
} edl_watch_opts;

typedef struct edl_watch edl_watch;

/* Start a watch; returns once the server has created it, so that any write made after this
 * returns is delivered. If the connection drops, the watch resumes on any endpoint from the
 * revision after the last one delivered; if that revision was compacted, a COMPACTED event
 * tells the caller and the watch goes on from the oldest revision still kept. */
int edl_watch_open(edl_etcd *c, edl_buf key, const edl_watch_opts *opts, edl_watch **out);
/* Next event, waiting up to timeout_ms (-1: for ever). EDL_ETIMEDOUT when none came. */
int edl_watch_next(edl_watch *w, edl_watch_event **ev, int timeout_ms);
/* Readable while events are queued. */
int edl_watch_fd(const edl_watch *w);
void edl_watch_event_free(edl_watch_event *ev);
/* Stop the watch and free it (any queued events are dropped with it). */
void edl_watch_close(edl_watch *w);

/* ---- election ---------------------------------------------------------------------------- */

/* A leader holds `key` under its lease; its create_revision fences its writes (a txn that
 * compares CREATE == leader.create_revision fails once another leader took over). */
typedef struct edl_leader {
    edl_kv *kv; /* key, value (the leader's identity), create_revision, lease */
} edl_leader;

/* One attempt: create key under lease if absent (or find it already under our lease). *won says
 * whether we lead; leader (may be NULL) receives the current leader either way. */
int edl_election_try(edl_etcd *c, edl_buf key, edl_buf value, int64_t lease, bool *won,
                     edl_leader *leader);
/* Campaign until we lead (0, *leader = our term) or timeout_ms passes (EDL_ETIMEDOUT; -1: for
 * ever), watching the key so that a vacancy is taken at once. *leader is written only when we
 * win (edl_election_leader says who leads otherwise), so it never holds another's term. The key
 * found under our own lease is ours (an earlier attempt whose reply was lost): we lead.
 * EDL_ELEASE if our lease is gone. */
int edl_election_campaign(edl_etcd *c, edl_buf key, edl_buf value, int64_t lease, int timeout_ms,
                          edl_leader *leader);
/* The current leader: EDL_ENOTFOUND when there is none. */
int edl_election_leader(edl_etcd *c, edl_buf key, edl_leader *leader);
/* Update the leader's value, fenced: EDL_ECONFLICT when we no longer lead. */
int edl_election_proclaim(edl_etcd *c, const edl_leader *leader, edl_buf value);
/* Step down (delete the key if still ours). EDL_ECONFLICT when we did not lead. */
int edl_election_resign(edl_etcd *c, const edl_leader *leader);
/* Add the fencing compare of this leader to a txn. */
void edl_txn_cmp_leader(edl_txn *t, const edl_leader *leader);
void edl_leader_clear(edl_leader *leader);

#ifdef __cplusplus
}
#endif
#endif
