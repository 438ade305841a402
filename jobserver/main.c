/* main.c: the edl-jobserver command: options, signals, then js_run(), the job server of one
 * job. The operator of TrainingJobs is its own program, edl-operator (operator/main.c);
 * `edl-jobserver --kubernetes` still starts it, for this release only. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/job.h"
#include "edl/log.h"
#include "edl/loop.h"
#include "edl/metrics.h"
#include "edl/trainingjob.h"
#include "jobserver.h"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: edl-jobserver --etcd URLS --job NAME [options]\n"
            "\n"
            "Watches the job's pods in etcd, assigns ranks and publishes numbered generations to\n"
            "jobs/<job>/generation. Run several replicas: one leads, the others stand by and take\n"
            "over within one lease TTL.\n"
            "\n"
            "Options:\n"
            EDL_ETCD_OPTIONS_HELP
            "  --job NAME          the job to serve (default: $EDL_JOB_ID)\n"
            "  --prefix PREFIX     etcd key prefix (default: %s)\n"
            "  --id ID             this replica's name in the election (default: host-pid)\n"
            "  --ttl SECONDS       leadership lease TTL (default: 10)\n"
            "  --exit-when-done    exit once the job has succeeded, failed or been stopped\n"
            "  --metrics-port P    serve /metrics (Prometheus) and /healthz on port P (0: off;\n"
            "                      auto: a free one, named in a log line at start)\n"
            "  --metrics-addr ADDR the address /metrics listens on, IPv4 or IPv6 (default: 0.0.0.0)\n"
            "  --log-level LEVEL   debug, info, warn or error (default: $EDL_LOG_LEVEL or info)\n"
            "  -h, --help          this text\n"
            "\n"
            "The operator of TrainingJob resources is edl-operator (see its --help);\n"
            "--kubernetes runs it with the other flags, for this release only.\n"
            "\n"
            "Exit codes: 0 stopped by SIGTERM/SIGINT (after resigning) or, with --exit-when-done,\n"
            "the job succeeded; 1 the job failed; 2 usage or configuration error; 3 etcd refused\n"
            "our TLS certificate or credentials (the message names the endpoint; an unreachable\n"
            "etcd is retried for ever); 4 the job was stopped (with --exit-when-done).\n",
            EDL_DEFAULT_PREFIX);
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* One etcd flag; 0, or -1 after saying why. */
static int etcd_option(edl_etcd_config *etcd, const char *flag, const char *value)
{
    char err[600];
    if (edl_etcd_config_set_option(etcd, flag, value, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "edl-jobserver: %s\n", err);
    return -1;
}

/* The etcd settings not given as flags from the environment, then checked. */
static int etcd_settings(edl_etcd_config *etcd)
{
    char err[600];
    if (edl_etcd_config_from_env(etcd, err, sizeof err) == 0 &&
        edl_etcd_config_check(etcd, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "edl-jobserver: %s\n", err);
    return -1;
}

/* The flags as they were before edl-operator: js_run's, with none of the operator's. */
static const struct option LONG_OPTIONS[] = {
    EDL_ETCD_LONG_OPTIONS,                 {"job", required_argument, 0, 'j'},
    {"prefix", required_argument, 0, 'p'}, {"id", required_argument, 0, 'i'},
    {"ttl", required_argument, 0, 't'},    {"exit-when-done", no_argument, 0, 'x'},
    {"metrics-port", required_argument, 0, 'm'}, {"metrics-addr", required_argument, 0, 'M'},
    {"log-level", required_argument, 0, 'l'}, {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* `edl-jobserver --kubernetes ARGS`, the operator until this release: says so, then runs
 * `edl-operator ARGS` from the directory of this program. Returns only on failure. */
static int run_operator_alias(int argc, char **argv)
{
    fprintf(stderr, "edl-jobserver: --kubernetes is deprecated and goes in the next release: "
                    "run edl-operator with the same flags, without --kubernetes\n");
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n > 0)
        path[n] = '\0';
    char *slash = n > 0 ? strrchr(path, '/') : NULL;
    if (!slash || (size_t)(slash - path) + sizeof "/edl-operator" > sizeof path) {
        fprintf(stderr, "edl-jobserver: cannot find this program's directory to run "
                        "edl-operator: run edl-operator yourself\n");
        return EDL_EXIT_USAGE;
    }
    strcpy(slash, "/edl-operator");
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args)
        return EDL_EXIT_USAGE;
    int k = 0;
    args[k++] = path;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--kubernetes") != 0)
            args[k++] = argv[i];
    execv(path, args);
    fprintf(stderr, "edl-jobserver: cannot run %s: %s; install edl-operator beside "
                    "edl-jobserver\n", path, strerror(errno));
    free(args);
    return EDL_EXIT_USAGE;
}

/* Whether the command line asks for the operator (--kubernetes before any "--"). */
static bool wants_operator(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--kubernetes") == 0)
            return true;
    return false;
}

int main(int argc, char **argv)
{
    const struct option *opts = LONG_OPTIONS;
    if (wants_operator(argc, argv))
        return run_operator_alias(argc, argv);
    edl_log_setup_from_env();
    js_config cfg = {.job = getenv("EDL_JOB_ID"), .prefix = EDL_DEFAULT_PREFIX, .ttl_s = 10};
    static edl_etcd_config etcd; /* static: still reachable on the early returns */
    edl_etcd_config_init(&etcd);
    cfg.etcd = &etcd;
    char idbuf[300];
    int ch, idx = 0;
    long v;
    while ((ch = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
        switch (ch) {
        case EDL_ETCD_OPT:
            if (etcd_option(&etcd, opts[idx].name, optarg))
                return EDL_EXIT_USAGE;
            break;
        case 'j': cfg.job = optarg; break;
        case 'p':
            if (!edl_prefix_valid(optarg)) {
                fprintf(stderr, "edl-jobserver: --prefix '%s': " EDL_PREFIX_RULE "\n", optarg);
                return EDL_EXIT_USAGE;
            }
            cfg.prefix = optarg;
            break;
        case 'i': cfg.id = optarg; break;
        case 't':
            if (parse_int(optarg, 1, 86400, &v)) {
                fprintf(stderr, "edl-jobserver: --ttl %s: expected whole seconds, 1 to 86400\n",
                        optarg);
                return EDL_EXIT_USAGE;
            }
            cfg.ttl_s = v;
            break;
        case 'x': cfg.exit_when_done = true; break;
        case 'M': cfg.metrics_addr = optarg; break;
        case 'm':
            if (edl_metrics_port_parse(optarg, &cfg.metrics_port)) {
                fprintf(stderr, "edl-jobserver: --metrics-port %s: expected a port, 0 to 65535, "
                        "or auto\n", optarg);
                return EDL_EXIT_USAGE;
            }
            break;
        case 'l': {
            edl_log_level lv;
            if (edl_log_level_parse(optarg, &lv)) {
                fprintf(stderr, "edl-jobserver: --log-level %s: expected debug, info, warn or "
                                "error\n", optarg);
                return EDL_EXIT_USAGE;
            }
            edl_log_setup(lv, EDL_LOG_PLAIN, NULL);
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EDL_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "edl-jobserver: unexpected argument \"%s\" (see --help)\n", argv[optind]);
        return EDL_EXIT_USAGE;
    }
    if (etcd_settings(&etcd))
        return EDL_EXIT_USAGE;
    if (etcd.n_endpoints == 0 || !cfg.job) {
        fprintf(stderr, "edl-jobserver: %s is required (see --help)\n",
                etcd.n_endpoints == 0 ? "--etcd" : "--job (or $EDL_JOB_ID)");
        return EDL_EXIT_USAGE;
    }
    if (cfg.metrics_addr && !edl_metrics_addr_valid(cfg.metrics_addr)) {
        fprintf(stderr, "edl-jobserver: --metrics-addr %s: expected an IPv4 or IPv6 address\n",
                cfg.metrics_addr);
        return EDL_EXIT_USAGE;
    }
    if (!edl_name_valid(cfg.job)) {
        fprintf(stderr, "edl-jobserver: job name \"%s\" is not valid: use 1-128 of "
                        "[A-Za-z0-9._-], not starting with '.' or '-'\n", cfg.job);
        return EDL_EXIT_USAGE;
    }
    if (!cfg.id) {
        char host[256] = "host";
        gethostname(host, sizeof host - 1);
        snprintf(idbuf, sizeof idbuf, "%s-%d", host, (int)getpid());
        cfg.id = idbuf;
    }
    edl_loop_block_signals(EDL_SIGNALS_STOP, NULL); /* before any thread starts */
    signal(SIGPIPE, SIG_IGN);
    int rc = js_run(&cfg); /* its loop takes the signals */
    edl_etcd_config_clear(&etcd);
    return rc;
}
