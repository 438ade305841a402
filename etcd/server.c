/* server.c: start, watch over and stop real etcd server processes on loopback.
 *
 * `edl run`, the tests and the benchmarks need a real etcd that lives exactly as long as they
 * do. Each member gets two free loopback ports (client, peer) and its own directory
 * <root>/m<i>/ holding data/ and etcd.log; the root is a fresh mkdtemp directory removed on
 * free. Children are started with edl_spawn (PR_SET_PDEATHSIG) so that a crashed parent
 * leaves no etcd behind. Errors are written to stderr because this file sits below the logging library and
 * the person reading a failed test needs the etcd command, ports and log in one place. */
#define _GNU_SOURCE
#include "edl/etcd_server.h"
#include "edl/common.h"
#include "edl/http.h"
#include "edl/proc.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_ATTEMPTS 3          /* a port can be taken between probing and etcd's bind */
#define DEFAULT_START_TIMEOUT_MS 15000
#define STOP_GRACE_MS 5000
#define HEALTH_POLL_MS 50
#define REAP_POLL_MS 10
#define LOG_TAIL_BYTES 1536
#define MAX_FIXED_ARGS 20

typedef struct member {
    pid_t pid;               /* 0 when not running */
    bool paused;
    int client_port;
    int peer_port;
    char endpoint[40];       /* http://127.0.0.1:C */
    char peer_url[40];       /* http://127.0.0.1:P */
    char dir[PATH_MAX];      /* <root>/m<i> */
    char data_dir[PATH_MAX]; /* <root>/m<i>/data */
    char log_path[PATH_MAX]; /* <root>/m<i>/etcd.log */
} member;

struct edl_etcd_server {
    char *bin;
    char **extra_args;       /* owned, NULL-terminated; reused by restart_member */
    int n;
    int start_timeout_ms;
    bool quiet;
    bool new_group;
    char *tls_cert, *tls_key, *tls_ca, *tls_client_cert, *tls_client_key; /* owned, may be NULL */
    bool tls_client_auth;
    char root[PATH_MAX];     /* "" when no directory exists */
    char token[80];
    char *endpoints;
    char *initial_cluster;
    member m[EDL_ETCD_SERVER_MAX_MEMBERS];
};

/* ---- small helpers ------------------------------------------------------------------- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool valid_member(const edl_etcd_server *s, int i)
{
    return s && i >= 0 && i < s->n;
}

static void describe_status(int status, char *buf, size_t len)
{
    if (WIFEXITED(status))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "was killed by signal %d (SIG%s)", WTERMSIG(status),
                 sigabbrev_np(WTERMSIG(status)) ? sigabbrev_np(WTERMSIG(status)) : "?");
    else
        snprintf(buf, len, "ended (wait status %d)", status);
}

/* Print the end of a member's log so that a failed start explains itself. */
static void print_log_tail(const edl_etcd_server *s, int i)
{
    const member *m = &s->m[i];
    if (!s->quiet) {
        fprintf(stderr, "  (etcd's own log went to stderr above)\n");
        return;
    }
    FILE *f = fopen(m->log_path, "r");
    if (!f) {
        fprintf(stderr, "  (no log at %s: %s)\n", m->log_path, strerror(errno));
        return;
    }
    char buf[LOG_TAIL_BYTES + 1];
    long start = 0;
    if (fseek(f, 0, SEEK_END) == 0 && ftell(f) > LOG_TAIL_BYTES)
        start = ftell(f) - LOG_TAIL_BYTES;
    fseek(f, start, SEEK_SET);
    size_t n = fread(buf, 1, LOG_TAIL_BYTES, f);
    fclose(f);
    buf[n] = '\0';
    char *p = buf, *save = NULL;
    if (start > 0 && strchr(buf, '\n')) /* skip the first line: it was cut */
        p = strchr(buf, '\n') + 1;
    fprintf(stderr, "  last lines of %s:\n", m->log_path);
    for (char *line = strtok_r(p, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        fprintf(stderr, "  | %s\n", line);
}

static void print_member_error(const edl_etcd_server *s, int i, const char *what)
{
    const member *m = &s->m[i];
    fprintf(stderr, "edl etcd_server: member m%d (%s, client port %d, peer port %d) %s\n", i,
            s->bin, m->client_port, m->peer_port, what);
    print_log_tail(s, i);
}

/* ---- ports and directories ----------------------------------------------------------- */

/* Ask the kernel for `count` distinct free loopback ports. All sockets stay bound until every
 * port is chosen so that one call never hands out the same port twice. */
static int pick_ports(int *ports, int count)
{
    int fds[2 * EDL_ETCD_SERVER_MAX_MEMBERS];
    int rc = 0, opened = 0;
    for (; opened < count; opened++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t alen = sizeof a;
        fds[opened] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[opened] < 0)
            break;
        if (bind(fds[opened], (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(fds[opened], (struct sockaddr *)&a, &alen) != 0) {
            close(fds[opened]);
            break;
        }
        ports[opened] = ntohs(a.sin_port);
    }
    if (opened < count) {
        fprintf(stderr, "edl etcd_server: cannot reserve a loopback port: %s\n", strerror(errno));
        rc = EDL_EIO;
    }
    for (int k = 0; k < opened; k++)
        close(fds[k]);
    return rc;
}

/* True when someone else now holds 127.0.0.1:port (etcd's own listeners use SO_REUSEADDR,
 * so ports in TIME_WAIT do not count). */
static bool port_in_use(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bool used = bind(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == EADDRINUSE;
    close(fd);
    return used;
}

static bool log_mentions(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    bool found = false;
    if (!f)
        return false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    if (remove(path) != 0 && errno != ENOENT)
        fprintf(stderr, "edl etcd_server: cannot remove %s: %s\n", path, strerror(errno));
    return 0; /* keep going: remove as much as possible */
}

static void remove_root(edl_etcd_server *s)
{
    if (s->root[0])
        nftw(s->root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    s->root[0] = '\0';
}

static int make_dirs(edl_etcd_server *s)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0])
        tmp = "/tmp";
    if (snprintf(s->root, sizeof s->root, "%s/edl-etcd-XXXXXX", tmp) >= (int)sizeof s->root ||
        !mkdtemp(s->root)) {
        fprintf(stderr, "edl etcd_server: cannot create a data directory under %s: %s "
                "(set TMPDIR to a writable directory)\n", tmp, strerror(errno));
        s->root[0] = '\0';
        return EDL_EIO;
    }
    for (int i = 0; i < s->n; i++) {
        member *m = &s->m[i];
        if (snprintf(m->dir, sizeof m->dir, "%s/m%d", s->root, i) >= (int)sizeof m->dir ||
            snprintf(m->data_dir, sizeof m->data_dir, "%s/data", m->dir) >=
                (int)sizeof m->data_dir ||
            snprintf(m->log_path, sizeof m->log_path, "%s/etcd.log", m->dir) >=
                (int)sizeof m->log_path) {
            fprintf(stderr, "edl etcd_server: TMPDIR %s is too long a path\n", tmp);
            return EDL_EINVAL;
        }
        if (mkdir(m->dir, 0700) != 0) {
            fprintf(stderr, "edl etcd_server: cannot create %s: %s\n", m->dir, strerror(errno));
            return EDL_EIO;
        }
    }
    return 0;
}

/* Choose ports and build every URL and the --initial-cluster list for one start attempt. */
static int plan_cluster(edl_etcd_server *s, int attempt)
{
    int ports[2 * EDL_ETCD_SERVER_MAX_MEMBERS];
    size_t cap = (size_t)s->n * 64;
    int rc = pick_ports(ports, 2 * s->n);
    if (rc)
        return rc;
    free(s->endpoints);
    free(s->initial_cluster);
    s->endpoints = calloc(1, cap);
    s->initial_cluster = calloc(1, cap);
    if (!s->endpoints || !s->initial_cluster)
        return EDL_ENOMEM;
    for (int i = 0; i < s->n; i++) {
        member *m = &s->m[i];
        m->client_port = ports[2 * i];
        m->peer_port = ports[2 * i + 1];
        snprintf(m->endpoint, sizeof m->endpoint, "%s://127.0.0.1:%d", s->tls_cert ? "https" : "http",
                 m->client_port);
        snprintf(m->peer_url, sizeof m->peer_url, "http://127.0.0.1:%d", m->peer_port);
        size_t e = strlen(s->endpoints), c = strlen(s->initial_cluster);
        snprintf(s->endpoints + e, cap - e, "%s%s", i ? "," : "", m->endpoint);
        snprintf(s->initial_cluster + c, cap - c, "%sm%d=%s", i ? "," : "", i, m->peer_url);
    }
    /* A token unique to this start keeps a member from ever joining a foreign cluster that
     * happens to sit on a reused port. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(s->token, sizeof s->token, "edl-%ld-%lld%09ld-%d", (long)getpid(),
             (long long)ts.tv_sec, ts.tv_nsec, attempt);
    return 0;
}

/* ---- spawning ------------------------------------------------------------------------ */

static void argv_free(char **v)
{
    for (size_t k = 0; v && v[k]; k++)
        free(v[k]);
    free(v);
}

__attribute__((format(printf, 3, 4)))
static void argv_addf(char **v, size_t *k, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&v[*k], fmt, ap) < 0)
        v[*k] = NULL;
    va_end(ap);
    if (v[*k])
        (*k)++;
}

static char **member_argv(const edl_etcd_server *s, int i, bool existing)
{
    const member *m = &s->m[i];
    size_t nextra = 0, k = 0;
    while (s->extra_args && s->extra_args[nextra])
        nextra++;
    size_t want = 13 + nextra;
    char **v = calloc(MAX_FIXED_ARGS + nextra + 1, sizeof *v);
    if (!v)
        return NULL;
    argv_addf(v, &k, "%s", s->bin);
    argv_addf(v, &k, "--name=m%d", i);
    argv_addf(v, &k, "--data-dir=%s", m->data_dir);
    argv_addf(v, &k, "--listen-client-urls=%s", m->endpoint);
    argv_addf(v, &k, "--advertise-client-urls=%s", m->endpoint);
    argv_addf(v, &k, "--listen-peer-urls=%s", m->peer_url);
    argv_addf(v, &k, "--initial-advertise-peer-urls=%s", m->peer_url);
    argv_addf(v, &k, "--initial-cluster=%s", s->initial_cluster);
    /* On a restart the member has data and etcd ignores the bootstrap flags; "existing" is
     * still the truthful answer should the data be gone. */
    argv_addf(v, &k, "--initial-cluster-state=%s", existing ? "existing" : "new");
    argv_addf(v, &k, "--initial-cluster-token=%s", s->token);
    argv_addf(v, &k, "--logger=zap");
    argv_addf(v, &k, "--log-level=error");
    argv_addf(v, &k, "--log-outputs=stderr");
    if (s->tls_cert) {
        argv_addf(v, &k, "--cert-file=%s", s->tls_cert);
        argv_addf(v, &k, "--key-file=%s", s->tls_key);
        want += 2;
    }
    if (s->tls_ca) {
        argv_addf(v, &k, "--trusted-ca-file=%s", s->tls_ca);
        want++;
    }
    if (s->tls_client_auth) {
        argv_addf(v, &k, "--client-cert-auth");
        want++;
    }
    for (size_t j = 0; j < nextra; j++)
        argv_addf(v, &k, "%s", s->extra_args[j]);
    if (k != want) {
        argv_free(v);
        return NULL;
    }
    return v;
}

/* Start member i (edl_spawn: it dies with us, and a failed exec is reported here). */
static int spawn_member(edl_etcd_server *s, int i, bool existing)
{
    char **argv = member_argv(s, i, existing);
    if (!argv)
        return EDL_ENOMEM;
    edl_spawn_opts so = {.argv = argv, .log_path = s->quiet ? s->m[i].log_path : NULL,
                         .new_group = s->new_group};
    char err[512];
    pid_t pid;
    int rc = edl_spawn(&so, &pid, err, sizeof err);
    argv_free(argv);
    if (rc) {
        fprintf(stderr, "edl etcd_server: member m%d: %s (install etcd-server or pass the path "
                "of an etcd binary)\n", i, err);
        return EDL_EIO;
    }
    s->m[i].pid = pid;
    s->m[i].paused = false;
    return 0;
}

/* ---- health and stopping --------------------------------------------------------------- */

typedef struct small_body {
    char data[256];
    size_t len;
} small_body;

static size_t small_body_write(char *p, size_t size, size_t n, void *ud)
{
    small_body *b = ud;
    size_t total = size * n, room = sizeof b->data - 1 - b->len;
    size_t take = total < room ? total : room;
    memcpy(b->data + b->len, p, take);
    b->len += take;
    b->data[b->len] = '\0';
    return total;
}

static bool health_ok(const edl_etcd_server *s, CURL *c, const char *endpoint)
{
    char url[64];
    small_body b = {.len = 0};
    long code = 0;
    snprintf(url, sizeof url, "%s/health", endpoint);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, small_body_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    edl_http_prepare(c, &(edl_http_opts){.connect_timeout_ms = 300, .timeout_ms = 1500,
                                         .ca_file = s->tls_ca, .cert_file = s->tls_client_cert,
                                         .key_file = s->tls_client_cert ? s->tls_client_key : NULL});
    if (curl_easy_perform(c) != CURLE_OK)
        return false;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    return code == 200 && strstr(b.data, "\"health\":\"true\"") != NULL;
}

/* Reap member i if it has exited; returns true (with its wait status) when it has. */
static bool member_exited(edl_etcd_server *s, int i, int *status)
{
    member *m = &s->m[i];
    if (m->pid <= 0)
        return false;
    if (waitpid(m->pid, status, WNOHANG) != m->pid)
        return false;
    m->pid = 0;
    m->paused = false;
    return true;
}

static void report_early_exit(edl_etcd_server *s, int i, int status, bool *port_clash)
{
    char what[160], how[96];
    member *m = &s->m[i];
    describe_status(status, how, sizeof how);
    snprintf(what, sizeof what, "%s before it became healthy", how);
    print_member_error(s, i, what);
    if (port_clash)
        *port_clash = (s->quiet && log_mentions(m->log_path, "address already in use")) ||
                      port_in_use(m->client_port) || port_in_use(m->peer_port);
}

/* Poll /health of the members in `mask` until all answer true, one exits, or time runs out. */
static int wait_healthy(edl_etcd_server *s, unsigned mask, bool *port_clash)
{
    edl_http_global_init();
    CURL *c = curl_easy_init();
    int64_t deadline = edl_monotonic_ms() + s->start_timeout_ms;
    int status = 0, rc = 0;
    if (!c)
        return EDL_ENOMEM;
    while (mask && rc == 0) {
        for (int i = 0; i < s->n && rc == 0; i++) {
            if (!(mask & (1u << i)))
                continue;
            bool healthy = s->m[i].pid > 0 && health_ok(s, c, s->m[i].endpoint);
            /* Checked after the probe too: a foreign server could answer on a port that our
             * member failed to bind. */
            if (member_exited(s, i, &status) || s->m[i].pid <= 0) {
                report_early_exit(s, i, status, port_clash);
                rc = EDL_EIO;
            } else if (healthy) {
                mask &= ~(1u << i);
            }
        }
        if (mask && rc == 0 && edl_monotonic_ms() >= deadline) {
            for (int i = 0; i < s->n; i++) {
                char what[96];
                snprintf(what, sizeof what, "did not become healthy within %d ms",
                         s->start_timeout_ms);
                if (mask & (1u << i))
                    print_member_error(s, i, what);
            }
            rc = EDL_ETIMEDOUT;
        }
        if (mask && rc == 0)
            sleep_ms(HEALTH_POLL_MS);
    }
    curl_easy_cleanup(c);
    return rc;
}

static void reap_blocking(member *m)
{
    while (waitpid(m->pid, NULL, 0) < 0 && errno == EINTR) {
    }
    m->pid = 0;
    m->paused = false;
}

/* Stop the members in `mask` together: SIGTERM (or SIGKILL), then SIGKILL after the grace. */
static void stop_members(edl_etcd_server *s, unsigned mask, bool kill_now)
{
    int status, left = 0;
    for (int i = 0; i < s->n; i++) {
        member *m = &s->m[i];
        if (!(mask & (1u << i)) || m->pid <= 0)
            continue;
        kill(m->pid, kill_now ? SIGKILL : SIGTERM);
        if (m->paused) /* a stopped process would hold SIGTERM pending for ever */
            kill(m->pid, SIGCONT);
        left++;
    }
    int64_t deadline = edl_monotonic_ms() + (kill_now ? 0 : STOP_GRACE_MS);
    while (left > 0 && edl_monotonic_ms() < deadline) {
        sleep_ms(REAP_POLL_MS);
        for (int i = 0; i < s->n; i++)
            if ((mask & (1u << i)) && member_exited(s, i, &status))
                left--;
    }
    for (int i = 0; i < s->n; i++) {
        member *m = &s->m[i];
        if (!(mask & (1u << i)) || m->pid <= 0)
            continue;
        if (!kill_now)
            fprintf(stderr, "edl etcd_server: member m%d (pid %d) ignored SIGTERM for %d ms; "
                    "killing it\n", i, (int)m->pid, STOP_GRACE_MS);
        kill(m->pid, SIGKILL);
        reap_blocking(m);
    }
}

static unsigned all_members(const edl_etcd_server *s)
{
    return (1u << s->n) - 1;
}

/* ---- public API ------------------------------------------------------------------------ */

static bool dup_opt(char **dst, const char *src)
{
    *dst = src ? strdup(src) : NULL;
    return !src || *dst;
}

static void server_release(edl_etcd_server *s)
{
    argv_free(s->extra_args);
    free(s->tls_cert);
    free(s->tls_key);
    free(s->tls_ca);
    free(s->tls_client_cert);
    free(s->tls_client_key);
    free(s->bin);
    free(s->endpoints);
    free(s->initial_cluster);
    free(s);
}

static edl_etcd_server *server_new(const edl_etcd_server_opts *o)
{
    const char *bin = o->etcd_bin;
    size_t nextra = 0;
    edl_etcd_server *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (!bin || !bin[0])
        bin = getenv("EDL_ETCD_BIN");
    s->bin = strdup(bin && bin[0] ? bin : "etcd");
    s->n = o->members ? o->members : 1;
    s->start_timeout_ms = o->start_timeout_ms > 0 ? o->start_timeout_ms : DEFAULT_START_TIMEOUT_MS;
    s->quiet = o->quiet;
    s->new_group = o->new_group;
    while (o->extra_args && o->extra_args[nextra])
        nextra++;
    s->extra_args = calloc(nextra + 1, sizeof *s->extra_args);
    bool ok = s->bin && s->extra_args && dup_opt(&s->tls_cert, o->tls_cert_file) &&
              dup_opt(&s->tls_key, o->tls_key_file) && dup_opt(&s->tls_ca, o->tls_ca_file) &&
              dup_opt(&s->tls_client_cert, o->tls_client_cert_file) &&
              dup_opt(&s->tls_client_key, o->tls_client_key_file);
    s->tls_client_auth = o->tls_client_cert_auth;
    for (size_t j = 0; ok && j < nextra; j++)
        ok = (s->extra_args[j] = strdup(o->extra_args[j])) != NULL;
    if (!ok) {
        server_release(s);
        return NULL;
    }
    return s;
}

static int start_attempt(edl_etcd_server *s, int attempt, bool *port_clash)
{
    int rc = plan_cluster(s, attempt);
    if (rc == 0)
        rc = make_dirs(s);
    for (int i = 0; rc == 0 && i < s->n; i++)
        rc = spawn_member(s, i, false);
    if (rc == 0)
        rc = wait_healthy(s, all_members(s), port_clash);
    return rc;
}

int edl_etcd_server_open(const edl_etcd_server_opts *opts, edl_etcd_server **out)
{
    edl_etcd_server_opts dflt = {.members = 1};
    edl_etcd_server *s;
    int rc = 0;
    if (!out)
        return EDL_EINVAL;
    *out = NULL;
    if (!opts)
        opts = &dflt;
    if (opts->members < 0 || opts->members > EDL_ETCD_SERVER_MAX_MEMBERS) {
        fprintf(stderr, "edl etcd_server: %d members asked for; allowed are 1 to %d\n",
                opts->members, EDL_ETCD_SERVER_MAX_MEMBERS);
        return EDL_EINVAL;
    }
    if ((opts->tls_cert_file == NULL) != (opts->tls_key_file == NULL) ||
        (opts->tls_client_cert_file == NULL) != (opts->tls_client_key_file == NULL) ||
        (opts->tls_client_cert_auth && (!opts->tls_ca_file || !opts->tls_client_cert_file))) {
        fprintf(stderr, "edl etcd_server: TLS needs a certificate and its key; client certificate "
                        "auth also needs a CA and a client certificate for the health probe\n");
        return EDL_EINVAL;
    }
    if (!(s = server_new(opts)))
        return EDL_ENOMEM;
    for (int attempt = 1; attempt <= START_ATTEMPTS; attempt++) {
        bool port_clash = false;
        rc = start_attempt(s, attempt, &port_clash);
        if (rc == 0) {
            *out = s;
            return 0;
        }
        stop_members(s, all_members(s), true);
        remove_root(s);
        if (!port_clash)
            break;
        if (attempt < START_ATTEMPTS)
            fprintf(stderr, "edl etcd_server: a port was taken by another process; "
                    "retrying with new ports (attempt %d of %d)\n", attempt + 1, START_ATTEMPTS);
    }
    server_release(s);
    return rc;
}

void edl_etcd_server_close(edl_etcd_server *s)
{
    if (!s)
        return;
    /* SIGKILL: the data is deleted next, so a graceful stop buys nothing, and members stopped
     * together would each wait ~5 s for a leadership transfer that cannot succeed. */
    stop_members(s, all_members(s), true);
    remove_root(s);
    server_release(s);
}

int edl_etcd_server_members(const edl_etcd_server *s)
{
    return s ? s->n : 0;
}

const char *edl_etcd_server_endpoints(const edl_etcd_server *s)
{
    return s ? s->endpoints : NULL;
}

const char *edl_etcd_server_endpoint(const edl_etcd_server *s, int i)
{
    return valid_member(s, i) ? s->m[i].endpoint : NULL;
}

int edl_etcd_server_client_port(const edl_etcd_server *s, int i)
{
    return valid_member(s, i) ? s->m[i].client_port : 0;
}

const char *edl_etcd_server_data_dir(const edl_etcd_server *s)
{
    return s ? s->root : NULL;
}

const char *edl_etcd_server_log_path(const edl_etcd_server *s, int i)
{
    return valid_member(s, i) && s->quiet ? s->m[i].log_path : NULL;
}

pid_t edl_etcd_server_pid(const edl_etcd_server *s, int i)
{
    return valid_member(s, i) ? s->m[i].pid : 0;
}

int edl_etcd_server_stop_member(edl_etcd_server *s, int i, bool kill_now)
{
    if (!valid_member(s, i))
        return EDL_EINVAL;
    stop_members(s, 1u << i, kill_now);
    return 0;
}

int edl_etcd_server_restart_member(edl_etcd_server *s, int i)
{
    if (!valid_member(s, i))
        return EDL_EINVAL;
    if (s->m[i].pid > 0) {
        fprintf(stderr, "edl etcd_server: member m%d (pid %d) is still running; stop it before "
                "restarting it\n", i, (int)s->m[i].pid);
        return EDL_EINVAL;
    }
    int rc = spawn_member(s, i, true);
    if (rc == 0)
        rc = wait_healthy(s, 1u << i, NULL);
    if (rc != 0)
        stop_members(s, 1u << i, true);
    return rc;
}

int edl_etcd_server_pause_member(edl_etcd_server *s, int i, bool pause)
{
    if (!valid_member(s, i))
        return EDL_EINVAL;
    member *m = &s->m[i];
    if (m->pid <= 0) {
        fprintf(stderr, "edl etcd_server: member m%d is not running; cannot %s it\n", i,
                pause ? "pause" : "resume");
        return EDL_EINVAL;
    }
    if (kill(m->pid, pause ? SIGSTOP : SIGCONT) != 0) {
        fprintf(stderr, "edl etcd_server: kill(%d, %s): %s\n", (int)m->pid,
                pause ? "SIGSTOP" : "SIGCONT", strerror(errno));
        return EDL_EIO;
    }
    m->paused = pause;
    return 0;
}
