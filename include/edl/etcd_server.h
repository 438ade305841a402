/* edl/etcd_server.h: start and stop real etcd server processes on loopback.
 *
 * Used by `edl run` (a job on one machine starts its own etcd), by the tests and by the
 * benchmarks. Each member gets free loopback ports and a temporary data directory that is
 * removed when the server is freed. Children die with their parent (PR_SET_PDEATHSIG). */
#ifndef EDL_ETCD_SERVER_H
#define EDL_ETCD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_ETCD_SERVER_MAX_MEMBERS 5

typedef struct edl_etcd_server_opts {
    const char *etcd_bin;        /* NULL: $EDL_ETCD_BIN, else "etcd" from PATH */
    int members;                 /* 1 (default when 0) .. EDL_ETCD_SERVER_MAX_MEMBERS */
    const char *const *extra_args; /* NULL-terminated extra flags for every member, or NULL */
    int start_timeout_ms;        /* how long to wait for health (default 15000) */
    bool quiet;                  /* send etcd's own log to <data dir>/etcd.log instead of stderr */
    bool new_group;              /* each member in a process group of its own: a terminal's Ctrl-C
                                  * reaches only its owner, which stops it when it is done with it */
    /* TLS on the client port (https:// endpoints) when cert and key are set; ca_file makes
     * clients verifiable (--trusted-ca-file) and client_cert_auth requires client
     * certificates, in which case client_cert/client_key are what the health probe presents. */
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *tls_ca_file;
    bool tls_client_cert_auth;
    const char *tls_client_cert_file;
    const char *tls_client_key_file;
} edl_etcd_server_opts;

typedef struct edl_etcd_server edl_etcd_server;

/* Start all members and wait until each answers /health. Retries with new ports (3 tries) when
 * another process took a chosen port first. Children get PR_SET_PDEATHSIG, which fires when
 * the calling *thread* ends: call this from a thread that lives as long as the server. */
int edl_etcd_server_open(const edl_etcd_server_opts *opts, edl_etcd_server **out);
/* Kill every member (SIGKILL: its data is deleted anyway, so there is nothing to flush), reap
 * it, remove the data directories, free. NULL is fine. */
void edl_etcd_server_close(edl_etcd_server *s);

int edl_etcd_server_members(const edl_etcd_server *s);
/* "http://127.0.0.1:P1,http://127.0.0.1:P2,..." for all members, in member order. */
const char *edl_etcd_server_endpoints(const edl_etcd_server *s);
/* "http://127.0.0.1:P" of member i. */
const char *edl_etcd_server_endpoint(const edl_etcd_server *s, int i);
pid_t edl_etcd_server_pid(const edl_etcd_server *s, int i); /* 0 when stopped */
/* Client port of member i (0 for a bad index): where a test proxy forwards to. */
int edl_etcd_server_client_port(const edl_etcd_server *s, int i);
/* The temporary directory holding every member's m<i>/data and m<i>/etcd.log. */
const char *edl_etcd_server_data_dir(const edl_etcd_server *s);
/* Path of member i's etcd.log when started quiet, else NULL. */
const char *edl_etcd_server_log_path(const edl_etcd_server *s, int i);

/* Stop member i gracefully (SIGTERM) or at once (SIGKILL), keeping its data and ports. */
int edl_etcd_server_stop_member(edl_etcd_server *s, int i, bool kill_now);
/* Start a stopped member again with the same data and ports; waits for health. */
int edl_etcd_server_restart_member(edl_etcd_server *s, int i);
/* Pause/resume member i with SIGSTOP/SIGCONT. */
int edl_etcd_server_pause_member(edl_etcd_server *s, int i, bool pause);

/* ---- a throwaway CA for a local etcd (etcd/certs.c) ---------------------------------------- */

/* The files edl_etcd_tls_make() writes into its directory. */
#define EDL_ETCD_TLS_CA "ca.crt"
#define EDL_ETCD_TLS_SERVER_CERT "server.crt" /* SAN IP:127.0.0.1, DNS:localhost */
#define EDL_ETCD_TLS_SERVER_KEY "server.key"
#define EDL_ETCD_TLS_CLIENT_CERT "client.crt"
#define EDL_ETCD_TLS_CLIENT_KEY "client.key"

/* Make a CA and, signed by it, a server and a client certificate (EC P-256, valid for `days`)
 * in dir, which should be private (0700): every file is 0600 and must not exist yet. The CA's
 * key is not kept. 0, or an EDL_E* code with the reason in err. */
int edl_etcd_tls_make(const char *dir, int days, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
