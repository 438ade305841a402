/* main.c: the edl-ps command: options, the job secret, then a parameter server that serves
 * until SIGTERM or SIGINT (under edl's agent: following the job's map of servers, and leaving
 * gracefully, its shards handed over, on the signal). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "edl/log.h"
#include "edl/loop.h"
#include "edl/metrics.h"
#include "edl/ps.h"
#include "internal.h"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: edl-ps [options]\n"
            "\n"
            "Serves parameter-server tables (sparse rows and dense arrays, updated in place by\n"
            "SGD, Adagrad or Adam) to the job's trainers over TCP. Every link proves the job\n"
            "secret first: it comes from $EDL_JOB_SECRET_FILE (or $EDL_JOB_SECRET).\n"
            "\n"
            "Options:\n"
            "  --listen-addr ADDR  the address to listen on, IPv4 or IPv6 (default: 127.0.0.1)\n"
            "  --port P            the port (default: $PADDLE_PORT, else 0: any free port)\n"
            "  --job NAME          the job id bound into every link (default: $EDL_JOB_ID, else\n"
            "                      edl)\n"
            "  --secret-file PATH  the job secret (default: $EDL_JOB_SECRET_FILE)\n"
            "  --threads N         event loops (default: the CPUs this process may use, at\n"
            "                      most 4)\n"
            "  --max-message BYTES the largest request or reply body (default: %u)\n"
            "  --max-connections N authenticated connections (default: 1024)\n"
            "  --max-unauthenticated N  connections not authenticated yet, bounded apart: at\n"
            "                      the bound a newcomer closes the oldest (default: 256)\n"
            "  --metrics-port P    serve /metrics and /healthz on port P (0 or auto: a free one;\n"
            "                      default: off): the server's counters, the shards lost and\n"
            "                      restored among them\n"
            "  --metrics-addr A    the address they listen on (default: 0.0.0.0)\n"
            "  --drain-timeout-ms MS  under edl's agent, how long a server told to stop may\n"
            "                      take to hand its shards over (default: %d)\n"
            "  --log-level LEVEL   debug, info, warn or error (default: $EDL_LOG_LEVEL or info)\n"
            "  -h, --help          this text\n"
            "\n"
            "Under edl's agent (EDL_ETCD_ENDPOINTS, EDL_JOB_ID and EDL_POD_ID set) the servers\n"
            "are elastic: each follows the job's map of servers in etcd, hands over the shards\n"
            "it stops owning, and keeps PS checkpoints in $EDL_CHECKPOINT_URI when set.\n"
            "\n"
            "Once listening it prints 'edl-ps: serving on ADDR:PORT' on stdout.\n"
            "Exit codes: 0 stopped by SIGTERM/SIGINT; 1 the server failed; 2 usage or\n"
            "configuration error.\n",
            EDL_PS_DEFAULT_MAX_MESSAGE, PS_DRAIN_TIMEOUT_MS);
}

static int number(const char *opt, const char *arg, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(arg, &end, 10);
    if (!*arg || *end || v < lo || v > hi) {
        fprintf(stderr, "edl-ps: %s '%s': want an integer in %ld..%ld\n", opt, arg, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

typedef struct ps_args {
    edl_ps_server_options o;
    const char *secret_file;
    int drain_ms;
    int metrics_port; /* -1: off */
    const char *metrics_addr;
} ps_args;

static int parse_args(int argc, char **argv, ps_args *a)
{
    static const struct option opts[] = {
        {"listen-addr", 1, 0, 'a'}, {"port", 1, 0, 'p'},      {"job", 1, 0, 'j'},
        {"secret-file", 1, 0, 's'}, {"threads", 1, 0, 't'},   {"max-message", 1, 0, 'm'},
        {"max-connections", 1, 0, 'c'}, {"log-level", 1, 0, 'l'}, {"help", 0, 0, 'h'},
        {"drain-timeout-ms", 1, 0, 'd'}, {"max-unauthenticated", 1, 0, 'u'},
        {"metrics-port", 1, 0, 'M'}, {"metrics-addr", 1, 0, 'A'},
        {0, 0, 0, 0}};
    const char *port = getenv("PADDLE_PORT");
    edl_log_level level;
    long v;
    if (edl_log_setup_from_env() != 0)
        return 2;
    a->o.job = getenv("EDL_JOB_ID");
    if (port && *port && number("$PADDLE_PORT", port, 0, 65535, &v) == 0)
        a->o.port = (int)v;
    else if (port && *port)
        return 2;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'a': a->o.listen_addr = optarg; break;
        case 'p': bad = number("--port", optarg, 0, 65535, &v), a->o.port = (int)v; break;
        case 'j': a->o.job = optarg; break;
        case 's': a->secret_file = optarg; break;
        case 't': bad = number("--threads", optarg, 1, 64, &v), a->o.threads = (int)v; break;
        case 'm':
            bad = number("--max-message", optarg, 4096, 1L << 30, &v);
            a->o.max_message = (uint32_t)v;
            break;
        case 'c':
            bad = number("--max-connections", optarg, 1, 1 << 20, &v);
            a->o.max_connections = (int)v;
            break;
        case 'M': { /* the agent's and job server's parser; here 0 is a free port too */
            int mport = 0;
            if (edl_metrics_port_parse(optarg, &mport) != 0) {
                fprintf(stderr, "edl-ps: --metrics-port '%s': want an integer in 0..65535 or "
                        "auto\n", optarg);
                bad = -1;
            }
            a->metrics_port = edl_metrics_listen_port(mport);
            break;
        }
        case 'A':
            if (!edl_metrics_addr_valid(optarg)) {
                fprintf(stderr, "edl-ps: --metrics-addr '%s': an IPv4 or IPv6 address\n", optarg);
                return 2;
            }
            a->metrics_addr = optarg;
            break;
        case 'u':
            bad = number("--max-unauthenticated", optarg, 1, 1 << 20, &v);
            a->o.max_unauthenticated = (int)v;
            break;
        case 'd':
            bad = number("--drain-timeout-ms", optarg, 0, 3600000, &v);
            a->drain_ms = (int)v;
            break;
        case 'l':
            if (edl_log_level_parse(optarg, &level) != 0) {
                fprintf(stderr, "edl-ps: --log-level '%s': debug, info, warn or error\n", optarg);
                return 2;
            }
            edl_log_setup(level, EDL_LOG_PLAIN, NULL);
            break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
        if (bad)
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "edl-ps: unexpected argument '%s' (try --help)\n", argv[optind]);
        return 2;
    }
    return 0;
}

static int load_secret(const ps_args *a, edl_job_secret *s)
{
    char why[512];
    int rc = a->secret_file ? edl_job_secret_load_file(s, a->secret_file, why, sizeof why)
                            : edl_job_secret_load(s, why, sizeof why);
    if (rc == EDL_ENOTFOUND)
        snprintf(why, sizeof why, "no job secret: set EDL_JOB_SECRET_FILE or --secret-file "
                 "(links to the parameter server are always authenticated)");
    if (rc)
        fprintf(stderr, "edl-ps: %s\n", why);
    return rc;
}

/* Room for the connections the server may hold (both bounds, and its own files): the soft
 * limit on open files is raised towards the hard one when it is lower. */
static void raise_fd_limit(const edl_ps_server_options *o)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)(o->max_connections ? o->max_connections : 1024) +
                  (rlim_t)(o->max_unauthenticated ? o->max_unauthenticated : 256) + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < want)
        EDL_WARN("ps", "open files are limited to %llu: fewer than the %llu connections "
                 "allowed (raise ulimit -n)", (unsigned long long)rl.rlim_cur,
                 (unsigned long long)want);
}

/* /metrics when asked for (--metrics-port), served from loop: 0, or 1 when it cannot listen. */
static int open_metrics(const ps_args *a, ps_metrics_src *src, edl_loop *loop,
                        edl_metrics_server **m)
{
    *m = NULL;
    if (a->metrics_port < 0)
        return 0;
    edl_metrics_opts mo = {.addr = a->metrics_addr, .port = a->metrics_port};
    if (edl_metrics_open(&mo, ps_write_metrics, src, m) != 0 ||
        edl_metrics_attach(*m, loop) != 0) {
        fprintf(stderr, "edl-ps: cannot serve /metrics on %s:%d\n",
                a->metrics_addr ? a->metrics_addr : "0.0.0.0", a->metrics_port);
        return 1;
    }
    printf("edl-ps: metrics on %s:%d\n", a->metrics_addr ? a->metrics_addr : "0.0.0.0",
           edl_metrics_port(*m));
    return 0;
}

int main(int argc, char **argv)
{
    ps_args a = {.drain_ms = PS_DRAIN_TIMEOUT_MS, .metrics_port = -1};
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc == 1 ? 0 : rc;
    edl_job_secret secret;
    edl_job_secret_init(&secret);
    if (load_secret(&a, &secret) != 0)
        return 2;
    a.o.secret = &secret;
    raise_fd_limit(&a.o);
    ps_waiter w; /* the signals blocked before the loops start: they inherit the mask */
    if (ps_waiter_open(&w) != 0) {
        fprintf(stderr, "edl-ps: cannot set up its loop (signalfd)\n");
        ps_waiter_close(&w);
        return 1;
    }
    edl_ps_server *s;
    char why[512];
    ps_follow *f = NULL;
    if ((rc = ps_follow_open(&f, why, sizeof why)) != 0 && rc != EDL_ENOTFOUND) {
        fprintf(stderr, "edl-ps: %s\n", why);
        edl_job_secret_clear(&secret);
        ps_waiter_close(&w);
        return 2;
    }
    a.o.checkpoint = f ? ps_follow_checkpoint(f) : NULL;
    a.o.wait_for_map = f != NULL;
    if ((rc = edl_ps_server_open(&a.o, &s, why, sizeof why)) != 0) {
        fprintf(stderr, "edl-ps: %s\n", why);
        edl_job_secret_clear(&secret);
        ps_follow_close(f);
        ps_waiter_close(&w);
        return rc == EDL_ECONFIG ? 2 : 1;
    }
    edl_job_secret_clear(&secret);
    if (edl_ps_server_start(s) != 0) {
        fprintf(stderr, "edl-ps: cannot start the event loops\n");
        edl_ps_server_close(s);
        ps_waiter_close(&w);
        return 1;
    }
    ps_metrics_src src = {.s = s, .job = a.o.job ? a.o.job : "edl",
                          .pod = getenv("EDL_POD_ID") ? getenv("EDL_POD_ID") : ""};
    edl_metrics_server *m = NULL;
    if (open_metrics(&a, &src, w.loop, &m) != 0) {
        edl_ps_server_close(s);
        ps_follow_close(f);
        ps_waiter_close(&w);
        return 1;
    }
    printf("edl-ps: serving on %s:%d\n", a.o.listen_addr ? a.o.listen_addr : "127.0.0.1",
           edl_ps_server_port(s));
    fflush(stdout);
    int sig = 0;
    if (f) {
        ps_follow_serve(s, f, &w, a.drain_ms);
    } else {
        while ((sig = ps_wait_signal(&w, -1)) == 0) {
        }
        EDL_INFO("ps", "%s: stopping", strsignal(sig));
    }
    edl_metrics_close(m);
    edl_ps_server_close(s);
    ps_follow_close(f);
    ps_waiter_close(&w);
    return 0;
}
