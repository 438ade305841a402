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
#include "edl/net.h"

static const char usage_text[] =
    "usage: edl-agent --etcd URLS --job NAME [options] -- TRAINER [ARGS...]\n"
    "       edl-agent --etcd URLS --role teacher --service NAME [--job NAME] [options]\n"
    "                 -- SERVER [ARGS...]\n"
    "       edl-agent --install DIR\n"
    "\n"
    "Registers this pod in a job under an etcd lease and runs TRAINER for every\n"
    "generation this pod is a member of (see docs/agent.md). --install copies the agent\n"
    "to DIR/edl-agent and exits (the operator's init container does that, DIR being\n"
    "/edl/bin): in the images, the portable bundle of PREFIX/lib/edl/agent (the agent\n"
    "and, in DIR/lib, its own loader and libraries), else this very binary; and the\n"
    "Python package edl of PREFIX/lib/edl/python, when there is one, to DIR/python.\n"
    "\n"
    "options:\n"
    EDL_ETCD_OPTIONS_HELP
    "  --job NAME           the job to join\n"
    "  --pod NAME           this pod's name (default: $EDL_POD_ID, else $HOSTNAME, else the host name)\n"
    "  --prefix PREFIX      etcd key prefix (default: /edl/v1)\n"
    "  --ttl SECONDS        lease TTL (default: the spec's ttl_s, 10)\n"
    "  --addr ADDR          address peers reach the trainer at (default: $POD_IP, else 127.0.0.1)\n"
    "  --port PORT          the trainer's port; rank 0's is MASTER_PORT; a teacher's server\n"
    "                       listens on it (default: a free port)\n"
    "  --metrics-port PORT  serve /metrics and /healthz on this port; auto: a free one, named\n"
    "                       in the pod's registration (edl status shows it) (default: 0 = off)\n"
    "  --metrics-addr ADDR  the address /metrics listens on, IPv4 or IPv6 (default: 0.0.0.0)\n"
    "  --grace-ms MS        SIGTERM-to-SIGKILL grace when stopping the trainer (default: 10000)\n"
    "  --scratch-dir DIR    where the agent makes its private directory (the trainer's\n"
    "                       TORCHELASTIC_ERROR_FILE), removed when it exits (default: $TMPDIR,\n"
    "                       else /tmp; edl run gives one it removes, for agents that are killed)\n"
    "  --role ROLE          worker (default): a trainer, started for every generation that\n"
    "                       lists the pod in members; or ps: a parameter server, started when\n"
    "                       the pod is listed in servers and kept while it stays listed (it\n"
    "                       follows the generations through etcd); its exit 0 is a clean\n"
    "                       leave (the agent exits 0); SIGTERM deletes the registration first;\n"
    "                       or teacher: an inference server (distillation, docs/distill.md),\n"
    "                       started at once and restarted after an exit (1 s backoff doubling\n"
    "                       to 30 s: teachers are stateless); while it answers its health\n"
    "                       check the agent registers it in the service (below) under its\n"
    "                       lease, and deletes that key at once when it exits, fails the\n"
    "                       check N times in a row, on SIGTERM (before stopping the server)\n"
    "                       and when the job ends (the agent then exits 0; --job is optional)\n"
    "\n"
    "teacher options (--role teacher):\n"
    "  --service NAME       the service: key PREFIX/services/NAME/teachers/POD, value\n"
    "                       {endpoint: http://ADDR:PORT, capacity, model, version, load}\n"
    "  --model M            the model's name (default: default)\n"
    "  --model-version V    its version (default: \"\")\n"
    "  --capacity N         students it serves at once (default: 1)\n"
    "  --health-path PATH   GET http://ADDR:PORT PATH must answer 2xx (default: /v1/models/M);\n"
    "                       a numeric \"load\" in its JSON reply is published as the load\n"
    "  --health-interval-ms MS  between checks (default: 1000)\n"
    "  --health-timeout-ms MS   one check's deadline (default: 2000)\n"
    "  --health-failures N  failed checks in a row that deregister it (default: 3)\n"
    "  The server gets EDL_ROLE_NAME=teacher, EDL_SERVICE, PORT and EDL_SERVICE_PORT (the\n"
    "  port it must listen on: --port), POD_IP, EDL_POD_ID, EDL_JOB_ID (with --job) and the\n"
    "  etcd settings (EDL_ETCD_*).\n"
    "  --startup-timeout S  how long to retry an unreachable etcd at start-up (default: 30)\n"
    "  --log-level LEVEL    debug, info, warn, error or off (default: $EDL_LOG_LEVEL, else info)\n"
    "  --help               this text\n"
    "\n"
    "exit codes:\n"
    "  0        the job succeeded (a teacher: the job ended, succeeded or failed)\n"
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
       O_ROLE, O_LOG, O_STARTUP, O_HELP, O_SERVICE, O_HPATH, O_MODEL, O_MVERSION, O_CAPACITY,
       O_HINTERVAL, O_HTIMEOUT, O_HFAILURES, O_SCRATCH };

#define TEACHER_LONG_OPTIONS                                                                   \
    {"service", required_argument, 0, O_SERVICE}, {"health-path", required_argument, 0, O_HPATH}, \
    {"model", required_argument, 0, O_MODEL}, {"model-version", required_argument, 0, O_MVERSION}, \
    {"capacity", required_argument, 0, O_CAPACITY},                                            \
    {"health-interval-ms", required_argument, 0, O_HINTERVAL},                                 \
    {"health-timeout-ms", required_argument, 0, O_HTIMEOUT},                                   \
    {"health-failures", required_argument, 0, O_HFAILURES}

/* The teacher role's options: 0 when c was one (an exit code when its value is bad), 1 when
 * c is no teacher option. */
static int teacher_option(int c, const char *arg, agent_opts *o)
{
    long long v;
    char **str = NULL;
    switch (c) {
    case O_SERVICE: str = &o->service; break;
    case O_HPATH: str = &o->health_path; break;
    case O_MODEL: str = &o->model; break;
    case O_MVERSION: str = &o->model_version; break;
    case O_CAPACITY:
        if (parse_int(arg, 1, 65535, &v))
            return bad("--capacity '%s': expected 1..65535", arg);
        o->capacity = (int)v;
        return 0;
    case O_HINTERVAL:
    case O_HTIMEOUT:
        if (parse_int(arg, 10, 3600000, &v))
            return bad("--%s '%s': expected milliseconds, 10..3600000", c == O_HINTERVAL ?
                       "health-interval-ms" : "health-timeout-ms", arg);
        *(c == O_HINTERVAL ? &o->health_interval_ms : &o->health_timeout_ms) = v;
        return 0;
    case O_HFAILURES:
        if (parse_int(arg, 1, 1000, &v))
            return bad("--health-failures '%s': expected 1..1000", arg);
        o->health_failures = (int)v;
        return 0;
    default: return 1;
    }
    free(*str);
    *str = strdup(arg);
    return 0;
}

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
        {"scratch-dir", required_argument, 0, O_SCRATCH},
        {"help", no_argument, 0, O_HELP}, TEACHER_LONG_OPTIONS, {0, 0, 0, 0}};
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
        case O_SCRATCH: str = &o->scratch_dir; break;
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
            if (edl_metrics_port_parse(optarg, &o->metrics_port))
                return bad("--metrics-port '%s': expected 0..65535 or auto", optarg);
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
        default: {
            int t = teacher_option(c, optarg, o);
            if (t == 1)
                return bad("unknown option or missing value: '%s'", argv[optind - 1]);
            if (t)
                return t;
        }
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

/* The teacher role's defaults and checks (edl/discovery.h's names are DNS labels: the
 * service, and the instance, which is the pod's name). 0 or an exit code. */
static int teacher_defaults(agent_opts *o)
{
    bool teacher = o->role && strcmp(o->role, EDL_ROLE_TEACHER) == 0;
    if (!teacher) {
        if (o->service || o->health_path || o->model || o->model_version || o->capacity ||
            o->health_interval_ms || o->health_timeout_ms || o->health_failures)
            return bad("%s", "--service, --health-*, --model, --model-version and --capacity "
                       "are for --role teacher");
        return 0;
    }
    if (!o->service)
        return bad("%s", "--role teacher needs --service NAME (where the teacher registers)");
    if (!edl_teacher_service_valid(o->service))
        return bad("--service '%s': expected 1-63 of [a-z0-9-], not starting or ending with '-'",
                   o->service);
    if (!edl_teacher_service_valid(o->pod))
        return bad("pod name '%s' is no valid teacher instance name (the service's key): use "
                   "1-63 of [a-z0-9-], or give --pod", o->pod);
    if (!o->model)
        o->model = strdup("default");
    if (!o->model_version)
        o->model_version = strdup("");
    if (!o->health_path && asprintf(&o->health_path, "/v1/models/%s", o->model) < 0)
        o->health_path = NULL;
    if (!o->health_path || o->health_path[0] != '/' || strpbrk(o->health_path, " \r\n"))
        return bad("--health-path '%s': expected a path starting with '/', without spaces",
                   o->health_path ? o->health_path : "");
    o->capacity = o->capacity ? o->capacity : 1;
    o->health_interval_ms = o->health_interval_ms ? o->health_interval_ms : 1000;
    o->health_timeout_ms = o->health_timeout_ms ? o->health_timeout_ms : 2000;
    o->health_failures = o->health_failures ? o->health_failures : 3;
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
    if (!o->role)
        o->role = strdup("worker");
    if (!o->job && strcmp(o->role, EDL_ROLE_TEACHER) != 0)
        return bad("%s", "--job is required (only a teacher may run without a job)");
    gethostname(hn, sizeof hn - 1);
    if (!o->pod && !(o->pod = env_or("EDL_POD_ID", NULL)) && !(o->pod = env_or("HOSTNAME", NULL)))
        o->pod = strdup(hn);
    o->host = strdup(hn);
    if (!o->prefix)
        o->prefix = strdup(EDL_DEFAULT_PREFIX);
    if (!o->addr)
        o->addr = env_or("POD_IP", "127.0.0.1");
    if (o->job && !edl_name_valid(o->job))
        return bad("job name '%s' is invalid: 1-128 of [A-Za-z0-9._-], not starting with '.' or '-'", o->job);
    if (!edl_name_valid(o->pod))
        return bad("pod name '%s' is invalid: 1-128 of [A-Za-z0-9._-], not starting with '.' or '-'", o->pod);
    if (strcmp(o->role, EDL_ROLE_WORKER) != 0 && strcmp(o->role, EDL_ROLE_PS) != 0 &&
        strcmp(o->role, EDL_ROLE_TEACHER) != 0)
        return bad("--role '%s': expected worker, ps or teacher", o->role);
    int rc = teacher_defaults(o);
    if (rc)
        return rc;
    struct in_addr ia;
    if (inet_pton(AF_INET, o->addr, &ia) != 1)
        return bad("--addr '%s': expected an IPv4 address", o->addr);
    if (!edl_prefix_valid(o->prefix))
        return bad("--prefix '%s': " EDL_PREFIX_RULE, o->prefix);
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
    free(o->scratch_dir);
    free(o->role);
    free(o->host);
    free(o->service);
    free(o->health_path);
    free(o->model);
    free(o->model_version);
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
