/* main.c: edl-agent's command line: options, their defaults from the environment, usage and
 * exit codes. Everything else happens in agent_run(). */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"
#include "edl/log.h"

static const char usage_text[] =
    "usage: edl-agent --etcd URLS --job NAME [options] -- TRAINER [ARGS...]\n"
    "       edl-agent --install DIR\n"
    "\n"
    "Registers this pod in a job under an etcd lease and runs TRAINER for every\n"
    "generation this pod is a member of (see docs/agent.md). --install copies the agent\n"
    "to DIR/edl-agent and exits (the operator's init container does that, DIR being\n"
    "/edl/bin): in the images, the portable bundle of PREFIX/lib/edl/agent (the agent\n"
    "and, in DIR/lib, its own loader and libraries), else this very binary.\n"
    "\n"
    "options:\n"
    EDL_ETCD_OPTIONS_HELP
    "  --job NAME           the job to join\n"
    "  --pod NAME           this pod's name (default: $EDL_POD_ID, else $HOSTNAME, else the host name)\n"
    "  --prefix PREFIX      etcd key prefix (default: /edl/v1)\n"
    "  --ttl SECONDS        lease TTL (default: the spec's ttl_s, 10)\n"
    "  --addr ADDR          address peers reach the trainer at (default: $POD_IP, else 127.0.0.1)\n"
    "  --port PORT          the trainer's port; rank 0's is MASTER_PORT (default: a free port)\n"
    "  --metrics-port PORT  serve /metrics and /healthz on this port (default: 0 = off)\n"
    "  --metrics-addr ADDR  the address /metrics listens on, IPv4 or IPv6 (default: 0.0.0.0)\n"
    "  --grace-ms MS        SIGTERM-to-SIGKILL grace when stopping the trainer (default: 10000)\n"
    "  --role ROLE          worker (default): a trainer, started for every generation that\n"
    "                       lists the pod in members; or ps: a parameter server, started when\n"
    "                       the pod is listed in servers and kept while it stays listed (it\n"
    "                       follows the generations through etcd); its exit 0 is a clean\n"
    "                       leave (the agent exits 0); SIGTERM deletes the registration first\n"
    "  --startup-timeout S  how long to retry an unreachable etcd at start-up (default: 30)\n"
    "  --log-level LEVEL    debug, info, warn, error or off (default: $EDL_LOG_LEVEL, else info)\n"
    "  --help               this text\n"
    "\n"
    "exit codes:\n"
    "  0        the job succeeded\n"
    "  1        the job failed\n"
    "  2        usage error or invalid configuration (options, job spec)\n"
    "  3        etcd unreachable at start-up, or it refused our TLS certificate or\n"
    "           credentials (the message names the endpoint)\n"
    "  4        the job was stopped (edl stop)\n"
    "  128+N    left gracefully on signal N (SIGTERM: 143, SIGINT: 130)\n";

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "edl-agent: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'edl-agent --help'.\n");
    va_end(ap);
    return EDL_EXIT_USAGE;
}

static int parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return (v && *v) ? strdup(v) : dflt ? strdup(dflt) : NULL;
}

enum { O_JOB = 256, O_POD, O_PREFIX, O_TTL, O_ADDR, O_PORT, O_MPORT, O_MADDR, O_GRACE,
       O_ROLE, O_LOG, O_STARTUP, O_HELP };

static int parse_args(int argc, char **argv, agent_opts *o)
{
    static const struct option longs[] = {
        EDL_ETCD_LONG_OPTIONS, {"job", required_argument, 0, O_JOB},
        {"pod", required_argument, 0, O_POD}, {"prefix", required_argument, 0, O_PREFIX},
        {"ttl", required_argument, 0, O_TTL}, {"addr", required_argument, 0, O_ADDR},
        {"port", required_argument, 0, O_PORT}, {"metrics-port", required_argument, 0, O_MPORT},
        {"metrics-addr", required_argument, 0, O_MADDR},
        {"grace-ms", required_argument, 0, O_GRACE}, {"role", required_argument, 0, O_ROLE},
        {"log-level", required_argument, 0, O_LOG}, {"startup-timeout", required_argument, 0, O_STARTUP},
        {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    long long v;
    int c, idx = 0;
    char err[600];
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+h", longs, &idx)) != -1) {
        char **str = NULL;
        switch (c) {
        case EDL_ETCD_OPT:
            if (edl_etcd_config_set_option(&o->etcd, longs[idx].name, optarg, err, sizeof err))
                return bad("%s", err);
            break;
        case O_JOB: str = &o->job; break;
        case O_POD: str = &o->pod; break;
        case O_PREFIX: str = &o->prefix; break;
        case O_ADDR: str = &o->addr; break;
        case O_MADDR: str = &o->metrics_addr; break;
        case O_ROLE: str = &o->role; break;
        case O_TTL:
            if (parse_int(optarg, 1, 86400, &v))
                return bad("--ttl '%s': expected seconds, 1..86400", optarg);
            o->ttl_s = v;
            break;
        case O_PORT:
            if (parse_int(optarg, 0, 65535, &v))
                return bad("--port '%s': expected 0..65535", optarg);
            o->port = (int)v;
            break;
        case O_MPORT:
            if (parse_int(optarg, 0, 65535, &v))
                return bad("--metrics-port '%s': expected 0..65535", optarg);
            o->metrics_port = (int)v;
            break;
        case O_GRACE:
            if (parse_int(optarg, 0, 3600000, &v))
                return bad("--grace-ms '%s': expected milliseconds, 0..3600000", optarg);
            o->grace_ms = v;
            break;
        case O_STARTUP:
            if (parse_int(optarg, 0, 86400, &v))
                return bad("--startup-timeout '%s': expected seconds, 0..86400", optarg);
            o->startup_timeout_ms = v * 1000;
            break;
        case O_LOG: {
            edl_log_level lv;
            if (edl_log_level_parse(optarg, &lv) != 0)
                return bad("--log-level '%s': expected debug, info, warn, error or off", optarg);
            edl_log_setup(lv, EDL_LOG_PLAIN, NULL);
            break;
        }
        case 'h':
        case O_HELP:
            fputs(usage_text, stdout);
            return -1;
        default:
            return bad("unknown option or missing value: '%s'", argv[optind - 1]);
        }
        if (str) {
            free(*str);
            *str = strdup(optarg);
        }
    }
    if (optind >= argc)
        return bad("%s", "no trainer command: put it after '--'");
    o->argv = argv + optind;
    return 0;
}

static int fill_defaults(agent_opts *o)
{
    char hn[256] = "", err[600];
    if (edl_etcd_config_from_env(&o->etcd, err, sizeof err) ||
        edl_etcd_config_check(&o->etcd, err, sizeof err))
        return bad("%s", err);
    if (o->etcd.n_endpoints == 0)
        return bad("%s", "no etcd endpoints: give --etcd or set EDL_ETCD_ENDPOINTS");
    if (!o->job)
        return bad("%s", "--job is required");
    gethostname(hn, sizeof hn - 1);
    if (!o->pod && !(o->pod = env_or("EDL_POD_ID", NULL)) && !(o->pod = env_or("HOSTNAME", NULL)))
        o->pod = strdup(hn);
    o->host = strdup(hn);
    if (!o->prefix)
        o->prefix = strdup(EDL_DEFAULT_PREFIX);
    if (!o->addr)
        o->addr = env_or("POD_IP", "127.0.0.1");
    if (!o->role)
        o->role = strdup("worker");
    if (!edl_name_valid(o->job))
        return bad("job name '%s' is invalid: 1-128 of [A-Za-z0-9._-], not starting with '.' or '-'", o->job);
    if (!edl_name_valid(o->pod))
        return bad("pod name '%s' is invalid: 1-128 of [A-Za-z0-9._-], not starting with '.' or '-'", o->pod);
    if (strcmp(o->role, EDL_ROLE_WORKER) != 0 && strcmp(o->role, EDL_ROLE_PS) != 0)
        return bad("--role '%s': expected worker or ps", o->role);
    struct in_addr ia;
    if (inet_pton(AF_INET, o->addr, &ia) != 1)
        return bad("--addr '%s': expected an IPv4 address", o->addr);
    if (o->prefix[0] != '/')
        return bad("--prefix '%s': must start with '/'", o->prefix);
    if (o->metrics_addr && !edl_metrics_addr_valid(o->metrics_addr))
        return bad("--metrics-addr '%s': expected an IPv4 or IPv6 address", o->metrics_addr);
    if (o->port == 0 && (o->port = edl_free_port(o->addr)) == 0)
        return bad("no free TCP port on %s for the trainer: give --port", o->addr);
    return 0;
}

static void opts_free(agent_opts *o)
{
    edl_etcd_config_clear(&o->etcd);
    free(o->job);
    free(o->pod);
    free(o->prefix);
    free(o->addr);
    free(o->metrics_addr);
    free(o->role);
    free(o->host);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--install") == 0)
        return agent_install(argv[2]);
    edl_log_setup_from_env();
    agent_opts o = {.grace_ms = 10000, .startup_timeout_ms = 30000};
    edl_etcd_config_init(&o.etcd);
    int rc = parse_args(argc, argv, &o);
    if (rc == 0)
        rc = fill_defaults(&o);
    if (rc == 0)
        rc = agent_run(&o);
    else if (rc < 0)
        rc = 0; /* --help */
    opts_free(&o);
    return rc;
}
