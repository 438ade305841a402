/* harness.h: what every edl test needs besides cmocka: time, a real etcd, etcdctl, a TCP proxy
 * that can freeze or drop connections, a fake HTTP server that answers badly on purpose, and
 * agents run by chroot in other root filesystems.
 *
 * Test files include <cmocka.h> themselves (after <stdarg.h>, <stddef.h>, <setjmp.h>); the
 * harness functions that "fail the test" do so with cmocka's fail_msg(). Nothing here keeps
 * global state: every proxy and fake server is its own object. */
#ifndef EDL_TESTS_HARNESS_H
#define EDL_TESTS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "edl/common.h"
#include "edl/etcd_server.h"

/* ---- time ---------------------------------------------------------------------------- */

int64_t harness_now_ms(void); /* CLOCK_MONOTONIC in milliseconds */
void harness_sleep_ms(int ms);
/* Poll cond(arg) until it holds or timeout_ms have passed: whether it held. The pause between
 * two polls starts at 10 ms and doubles up to 200 ms, so that a quick condition is seen at once
 * and a costly one (a kubectl, an HTTP request) does not load the machine. The way to wait for
 * something a test can observe, instead of a fixed sleep; a fixed sleep is for "nothing
 * happens in this time" (or for time that must pass, a TTL) and says so in a comment. */
bool harness_wait_until(bool (*cond)(void *arg), void *arg, int timeout_ms);
/* The same for a condition written inline: HARNESS_WAIT_UNTIL(expr, timeout_ms) is whether
 * expr held within timeout_ms. */
#define HARNESS_WAIT_UNTIL(expr, timeout_ms)                                                   \
    __extension__({                                                                            \
        int64_t harness_deadline_ = harness_now_ms() + (timeout_ms);                           \
        int harness_pause_ = 10;                                                               \
        bool harness_held_;                                                                    \
        while (!(harness_held_ = (expr)) && harness_now_ms() < harness_deadline_) {            \
            harness_sleep_ms(harness_pause_);                                                  \
            harness_pause_ = harness_pause_ < 200 ? harness_pause_ * 2 : 200;                  \
        }                                                                                      \
        harness_held_;                                                                         \
    })
/* Remove a directory and everything below it (links are removed, not followed). */
void harness_rmtree(const char *dir);
/* A test program's scratch directory: mkdtemp of template (".../name.XXXXXX") into dir; with
 * own_state, EDL_STATE_DIR is set to <dir>/state so that `edl run` keeps its state there.
 * harness_scratch_close removes it (kept, and named on stderr, under EDL_TEST_KEEP). */
void harness_scratch_open(char *dir, size_t len, const char *template, bool own_state);
void harness_scratch_close(const char *dir);
/* Run `edl ARGS...` (args NULL-terminated, at most 30) to its end, killed after timeout_ms,
 * with its output in <dir>/cmd.out and copied into out: its exit status (harness_run). */
int harness_edl(const char *dir, int timeout_ms, char *out, size_t outlen,
                const char *const *args);

/* ---- processes (harness_proc.c) ------------------------------------------------------ */

#include <sys/types.h>
/* Start argv[0] (a path) with argv; it dies with the test (PR_SET_PDEATHSIG). Output goes to
 * log_path (appended) or, when NULL, to the test's own stdout/stderr. -1 on failure. */
pid_t harness_spawn(const char *const *argv, const char *log_path);
/* The same in a process group of its own, as a shell starts a job: kill(-pid, SIGINT) is then
 * what a terminal's Ctrl-C does to it. */
pid_t harness_spawn_group(const char *const *argv, const char *log_path);
/* Wait up to timeout_ms for the child to end: its exit status, 128+signal when killed, -1 on
 * timeout (it is still running), -2 when it is not our child. */
int harness_wait_exit(pid_t pid, int timeout_ms);
/* Send a signal; after SIGKILL also reap the child. */
void harness_kill(pid_t pid, int sig);
/* The file's contents in buf (NUL-terminated, cut to len - 1; "" when unreadable): buf. */
char *harness_read_file(const char *path, char *buf, size_t len);
/* Run argv to its end (killed after timeout_ms) with its output in log_path (truncated first)
 * and copied into out (NUL-terminated; out may be NULL): its exit status as above. */
int harness_run(const char *const *argv, const char *log_path, int timeout_ms, char *out,
                size_t outlen);

/* Run a /bin/sh command line; its stdout into out (NUL-terminated; out may be NULL): the exit
 * status as above, -1 when it could not be run. */
int harness_shell(const char *cmd, char *out, size_t outlen);

/* ---- HTTP client and ports (harness_net.c) ------------------------------------------- */

/* Send req (raw bytes) on a fresh connection to 127.0.0.1:port and read the whole reply into
 * out (NUL-terminated). Returns the HTTP status, -1 when nothing sensible came back. */
int harness_http_request(int port, const char *req, size_t req_len, char *out, size_t outlen);
/* GET path; as above. */
int harness_http_get(int port, const char *path, char *out, size_t outlen);
/* A TCP port on 127.0.0.1 that was free a moment ago (-1 on failure). */
int harness_free_port(void);
/* Whether something listens on 127.0.0.1:port (a connection is opened and closed at once):
 * with HARNESS_WAIT_UNTIL, the wait for a server to be up. */
bool harness_port_open(int port);

/* ---- a flood of strangers on a port (harness_flood.c) -------------------------------- */

typedef struct harness_flood harness_flood;
/* Strangers on 127.0.0.1:port from a thread, until harness_flood_stop, max_ms or 50,000
 * connections: in turn one that stays silent, one reset at once, one that sends `hello`
 * (hello_len <= 256 bytes: a well-formed hello without the secret) and one that sends
 * garbage, from 127.0.0.1, .2, .3 and .4; at most `hold` are held (the oldest is reset to make
 * room). NULL when the thread cannot start. */
harness_flood *harness_flood_start(int port, const void *hello, size_t hello_len, int hold,
                                   int max_ms);
/* Connections made so far. */
long harness_flood_made(harness_flood *f);
/* Stop the flood and reset what it holds: the connections it made. */
long harness_flood_stop(harness_flood *f);

/* ---- etcd ---------------------------------------------------------------------------- */

/* Start `members` real etcd members (quiet: logs in the data dir) with optional extra flags
 * (NULL-terminated, may be NULL). Fails the test with the reason when etcd does not come up.
 * Free with edl_etcd_server_close(). */
edl_etcd_server *harness_etcd_open(int members, const char *const *extra_args);
/* One member with authentication on (extra_args as above): users root:rootpw (role root) and
 * trainer:s3cret, whose role edl may read and write under /edl/. Fails the test otherwise. */
edl_etcd_server *harness_etcd_open_auth(const char *const *extra_args);
/* A cmocka teardown that frees the edl_etcd_server in *state: a test that stores its server
 * there (`s = *state = harness_etcd_open(...)`) cleans up even when an assertion fails. */
int harness_teardown_etcd(void **state);

/* Run `etcdctl --endpoints=<endpoints> [--user=<user_pass>] <args>` with ETCDCTL_API=3.
 * args_fmt is printf-formatted, then split into words by /bin/sh (quote as in a shell).
 * Returns etcdctl's exit status (128+signal if killed, -1 if it could not be run); its output
 * goes to the test's stdout/stderr. */
int harness_etcdctl(const char *endpoints, const char *user_pass, const char *args_fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same, capturing stdout into out (always NUL-terminated, truncated to outlen - 1). */
int harness_etcdctl_out(char *out, size_t outlen, const char *endpoints, const char *user_pass,
                        const char *args_fmt, ...) __attribute__((format(printf, 5, 6)));

/* ---- TCP proxy ----------------------------------------------------------------------- */

/* Forwards every connection accepted on 127.0.0.1:<proxy port> to 127.0.0.1:<target port>,
 * from one background thread. */
typedef struct harness_proxy harness_proxy;

harness_proxy *harness_proxy_open(int target_port); /* NULL (and a message) on failure */
int harness_proxy_port(const harness_proxy *p);
/* While frozen no byte moves in either direction and new connections are accepted but not
 * connected onward: a network partition. Takes effect before the call returns. */
void harness_proxy_freeze(harness_proxy *p, bool on);
/* Close every current connection, both sides, before returning. */
void harness_proxy_drop(harness_proxy *p);
/* Connections accepted from now on go to the new port; existing ones stay where they are. */
void harness_proxy_set_target(harness_proxy *p, int target_port);
/* Number of connections accepted so far. */
int harness_proxy_accepted(harness_proxy *p);
void harness_proxy_close(harness_proxy *p); /* closes everything, joins, frees; NULL is fine */

/* ---- fake HTTP server ---------------------------------------------------------------- */

/* A stand-in HTTP/1.1 server for testing a client against hostile replies. One thread
 * accepts; each connection gets its own thread; keep-alive and pipelining work. */
typedef struct harness_http harness_http;

enum harness_http_mode {
    HTTP_NORMAL,         /* correct Content-Length, connection kept alive */
    HTTP_TRUNCATED,      /* Content-Length claims 100 bytes more than sent, then close */
    HTTP_CHUNKED,        /* chunked encoding, one chunk per line of body, then the end chunk */
    HTTP_CHUNKED_HANG,   /* as HTTP_CHUNKED but never ends: a watch stream left open */
    HTTP_CLOSE_NO_REPLY, /* read the request, close without a byte */
    HTTP_HANG,           /* read the request, never answer (until the client leaves or stop) */
    HTTP_HUGE,           /* chunked, body repeated for ever or up to the huge limit */
};

harness_http *harness_http_open(void); /* NULL (and a message) on failure */
int harness_http_port(const harness_http *h);
const char *harness_http_url(const harness_http *h); /* "http://127.0.0.1:P" */
/* The reply for every path without its own (default: 200, "{}", HTTP_NORMAL). The body is
 * copied. An empty body in HTTP_HUGE mode streams 'x' bytes. */
void harness_http_reply(harness_http *h, int status, const char *body, size_t body_len,
                        enum harness_http_mode mode);
/* The reply for requests whose path (without "?query") equals `path` (up to 16 paths). */
void harness_http_reply_path(harness_http *h, const char *path, int status, const char *body,
                             size_t body_len, enum harness_http_mode mode);
/* HTTP_HUGE stops (with a proper end chunk) after this many body bytes; 0 = never. */
void harness_http_huge_limit(harness_http *h, size_t max_bytes);
/* Copy the last request's path and body (each NUL-terminated, truncated to fit; either
 * buffer may be NULL). Returns the number of requests seen so far. */
int harness_http_last_request(harness_http *h, char *path, size_t pathlen, char *body,
                              size_t bodylen);
int harness_http_requests(harness_http *h);
void harness_http_close(harness_http *h); /* closes every connection, joins, frees */

/* ---- etcd clients (harness_client.c) --------------------------------------------------- */

struct edl_etcd;
/* A client for the endpoints (timeout_ms 0: the default); fails the test on error. */
struct edl_etcd *harness_client(const char *endpoints, int timeout_ms);
/* The same over TLS: the CA that verifies etcd, the client certificate and key (each may be
 * NULL). */
struct edl_etcd *harness_tls_client(const char *endpoints, int timeout_ms, const char *ca_file,
                                    const char *cert_file, const char *key_file);
/* Put a C-string value; fails the test (with the client's message) on error. */
void harness_put(struct edl_etcd *c, const char *key, const char *value);
/* The value of key into out, or NULL when absent; fails the test on other errors. */
char *harness_get(struct edl_etcd *c, const char *key, char *out, size_t outlen);

/* A group fixture: one etcd of `members` members (extra flags may be NULL) and a client for
 * all of them, stored through the pointers. Call from a cmocka group setup; close frees both. */
void harness_open_etcd(int members, const char *const *extra_args, edl_etcd_server **srv,
                       struct edl_etcd **client);
void harness_close_etcd(edl_etcd_server **srv, struct edl_etcd **client);
struct edl_watch;
struct edl_watch_event;
/* The next event that is not a PROGRESS notification; fails the test after timeout_ms. */
struct edl_watch_event *harness_next_event(struct edl_watch *w, int timeout_ms);
/* A proxy in front of member 0 of srv and a client that talks through it (a partition can
 * then be made with harness_proxy_freeze/drop). Free both with harness_close_proxied(). */
struct edl_etcd *harness_client_via_proxy(edl_etcd_server *srv, harness_proxy **proxy);
void harness_close_proxied(struct edl_etcd *client, harness_proxy *proxy);

/* ---- job keys (harness_client.c) -------------------------------------------------------- */

#include "edl/job.h"

/* One key of a job under the default prefix, made by the job model's builder (edl/job.h) so
 * that tests name keys exactly as the programs do: kind EDL_KEY_POD and EDL_KEY_STATUS take the
 * pod in name, EDL_KEY_GEN takes gen and the entry name ("" for the generation's prefix),
 * EDL_KEY_OTHER gives the job's own prefix. Written into buf, which is returned; fails the test
 * when it does not fit. */
char *harness_job_key(char *buf, size_t len, const char *job, edl_job_key_kind kind,
                      const char *name, int64_t gen);

/* ---- S3 server (harness_s3.c) ------------------------------------------------------------ */

#include "edl/storage.h"

/* A real s3rver on loopback (bucket "edl-test"), or the endpoint in EDL_TEST_S3_ENDPOINT
 * (bucket EDL_TEST_S3_BUCKET, credentials from AWS_*). */
typedef struct harness_s3 harness_s3;

/* False when s3rver is not installed (run scripts/install-deps) and no endpoint is set. */
bool harness_s3_available(void);
harness_s3 *harness_s3_open(void); /* NULL (and the reason on stderr) on failure */
const char *harness_s3_endpoint(const harness_s3 *h);
int harness_s3_port(const harness_s3 *h); /* 0 for an external endpoint */
bool harness_s3_external(const harness_s3 *h);
/* A fresh "s3://bucket/<name>-<pid>-<n>" URI in out (returned). */
const char *harness_s3_uri(harness_s3 *h, const char *name, char *out, size_t outlen);
/* A storage config for uri on this server (short retries so failure tests are quick). */
void harness_s3_config(const harness_s3 *h, edl_storage_config *cfg, const char *uri);
void harness_s3_close(harness_s3 *h); /* kills the server, removes its data; NULL is fine */
/* The object under key at uri (any store; sc may be NULL for the defaults) is exactly want:
 * read past the checkpoint layer, whose digest is taken from whatever was written. */
void harness_stored_equal(const edl_storage_config *sc, const char *uri, const char *key,
                          const void *want, size_t len);

/* ---- a stand-in Kubernetes cluster and the real kubectl (harness_k8s.c) ----------------- */

/* tests/k8s_standin (an API server and kubelet stand-in, see its README) on a free loopback
 * port, with its kubelet running pods as local processes under a fresh directory, and a
 * kubeconfig for it. */
typedef struct harness_k8s harness_k8s;

/* False (with a message) when the real kubectl is not installed (scripts/install-deps). */
bool harness_kubectl_available(void);
/* extra_args: more k8s-standin flags (NULL-terminated, may be NULL). Fails the test when it
 * does not come up. */
harness_k8s *harness_k8s_open(const char *const *extra_args);
const char *harness_k8s_kubeconfig(const harness_k8s *k);
const char *harness_k8s_url(const harness_k8s *k);      /* "http://127.0.0.1:P" */
const char *harness_k8s_dir(const harness_k8s *k);      /* a scratch directory of the test */
/* Run the real kubectl with this kubeconfig; args_fmt is printf-formatted, then split by
 * /bin/sh. Its stdout into out (may be NULL); its exit status. */
int harness_kubectl(harness_k8s *k, char *out, size_t outlen, const char *args_fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Wait until `kubectl get <what> -o jsonpath=<path>` prints want (timeout_ms); fails the test
 * with the last output otherwise. */
void harness_kubectl_wait(harness_k8s *k, const char *what, const char *jsonpath,
                          const char *want, int timeout_ms);
/* One of the stand-in's request counters (GET /standin/stats, e.g. "create pods"); 0 when
 * absent. */
long harness_k8s_stat(harness_k8s *k, const char *counter);
/* POST /standin/faults with this JSON (one fault or an array); NULL: DELETE them all. Fails
 * the test when the stand-in refuses it. */
void harness_k8s_fault(harness_k8s *k, const char *json);
/* {"<client> <verb> <group>/<resource>": count} (tests/k8s_standin/README.md); the caller
 * frees it. */
struct cJSON *harness_k8s_access(harness_k8s *k);
void harness_k8s_close(harness_k8s *k); /* kills the stand-in and its pods; NULL is fine */

/* ---- agents in other roots, by chroot (harness_chroot.c) -------------------------------- */

/* Run a /bin/sh command line made from fmt; fails the test (naming the command) unless it
 * exits 0. */
void harness_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The path of a program on PATH into out: false when there is none. */
bool harness_which(const char *name, char *out, size_t len);
/* Why chrooted agents cannot run here (not root, no chroot; built with sanitizers, which read
 * /proc, no unshare --mount-proc to give the root one), or NULL when they can. */
const char *harness_chroot_missing(void);
/* True when /bin/busybox is a static binary (Debian's busybox-static). */
bool harness_busybox_static(void);
/* Make at dir a root holding nothing but that busybox (/bin/busybox, /bin/sh) and /tmp. */
void harness_busybox_root(const char *dir);
/* The operator's init container: `env -i PATH=/usr/local/bin chroot --userspec=65532:65532
 * IMAGE edl-agent --install /edl/bin`, IMAGE being the root of an agent image (IMAGE/edl/bin,
 * made if missing, mode 0777, stands for the emptyDir); what it installed then becomes
 * ROOT/edl/bin, as the volume that both containers mount. Its output (logged to log) into out;
 * fails the test unless it exits 0. */
void harness_chroot_install(const char *image, const char *root, const char *log, char *out,
                            size_t len);

typedef struct harness_chroot_job {
    edl_etcd_server *srv;     /* the job's etcd, on the host */
    struct edl_etcd *client;  /* a client of it */
    const char *root;         /* where the agents run (chroot) */
    const char *agent;        /* the agent's path inside root, e.g. /edl/bin/edl-agent */
    const char *userspec;     /* their user, e.g. "1000:1000" (chroot --userspec) */
    const char *log_dir;      /* logs: <log_dir>/<job>.<pod>.log, <job>.jobserver.log */
} harness_chroot_job;

/* A trainer for any root, busybox-only or a distribution's: writes its environment and
 * "uid=<its uid>" to /tmp/<job>.<pod>.env in the root, then exits 0. */
#define HARNESS_CHROOT_ENV_SCRIPT                                                              \
    "b=$(command -v busybox); f=/tmp/$EDL_JOB_ID.$EDL_POD_ID; "                                \
    "{ $b env; echo uid=$($b id -u); } > $f.tmp && $b mv $f.tmp $f.env"
/* Run job with the pods w0 and w1 (spec: min = max = 2, no restarts): the real job server on
 * the host, and for each pod `env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/ chroot
 * --userspec=USER ROOT AGENT --etcd ... --job JOB --pod wN -- /bin/sh -c SCRIPT` (ROOT gets a
 * /dev/null, as every container has). Fails the test, with the agent's log, unless both agents
 * exit want; the job's final generation into g (edl_generation_clear it). */
void harness_chroot_run(const harness_chroot_job *j, const char *job, const char *script,
                        int want, edl_generation *g);
/* After a successful run of HARNESS_CHROOT_ENV_SCRIPT: each trainer ran as uid, with the rank
 * that g gives its pod, WORLD_SIZE 2, MASTER_ADDR 127.0.0.1 and a MASTER_PORT, its job and pod
 * names, and no LD_ variable. */
void harness_chroot_check_env(const harness_chroot_job *j, const char *job,
                              const edl_generation *g, const char *uid);

/* ---- parameter servers in this process (harness_ps.c) ------------------------------------ */

#include "edl/ps.h"

#define HARNESS_PS_MAX 4
/* n servers (threads of this process) on free loopback ports, serving job "job-a" with a
 * fixed secret; extra options (NULL: defaults) apply to each. Fails the test on error. */
typedef struct harness_ps {
    edl_job_secret secret;
    edl_ps_server *srv[HARNESS_PS_MAX];
    char eps[HARNESS_PS_MAX][64];
    const char *ep[HARNESS_PS_MAX];
    int n;
} harness_ps;

void harness_ps_secret(edl_job_secret *s, uint8_t byte); /* 32 bytes of `byte` */
void harness_ps_open(harness_ps *k, int n, const edl_ps_server_options *extra);
void harness_ps_close(harness_ps *k);
/* A client of all of k's servers; fails the test on error. */
edl_ps_client *harness_ps_client(const harness_ps *k, int timeout_ms);
/* Fails the test with the client's message when rc != 0. */
void harness_ps_ok(edl_ps_client *c, int rc);

/* ---- etcd's own events, for waits (harness.c) ------------------------------------------ */

/* The sum over etcd's running members of the samples on /metrics whose line starts with
 * `sample` ("name" alone matches the unlabelled "name value" and every labelled "name{...}"):
 * how a test sees etcd renew a lease (etcd_debugging_lease_renewed_total) or a client open a
 * watch (etcd_debugging_mvcc_watcher_total). -1 when a member's /metrics cannot be read. */
double harness_etcd_metric(const edl_etcd_server *s, const char *sample);
/* Grant a witness lease of ttl_s seconds that nobody renews and wait up to timeout_ms for etcd
 * to expire it: whether it did. A lease granted before the call with the same TTL and still
 * alive afterwards was renewed: etcd would have expired it first. */
bool harness_etcd_outlive_lease(struct edl_etcd *c, int64_t ttl_s, int timeout_ms);

#endif
