/* main.c: the edl-jobserver command: options, signals, then js_run() (one job) or, with
 * --kubernetes, op_run() (the operator of every TrainingJob). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/job.h"
#include "edl/log.h"
#include "edl/metrics.h"
#include "edl/trainingjob.h"
#include "jobserver.h"
#include "operator.h"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: edl-jobserver --etcd URLS --job NAME [options]\n"
            "       edl-jobserver --etcd URLS --kubernetes [Kubernetes options] [options]\n"
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
            "  --metrics-port P    serve /metrics (Prometheus) and /healthz on port P (0: off)\n"
            "  --metrics-addr ADDR the address /metrics listens on, IPv4 or IPv6 (default: 0.0.0.0)\n"
            "  --log-level LEVEL   debug, info, warn or error (default: $EDL_LOG_LEVEL or info)\n"
            "  -h, --help          this text\n"
            "\n"
            "Kubernetes (the operator of TrainingJob resources; see docs/kubernetes.md):\n"
            "  --kubernetes        serve every TrainingJob of the namespace instead of one --job\n"
            "  --kubeconfig FILE   API server and credentials (default: $KUBECONFIG, then the\n"
            "                      in-cluster service account, then ~/.kube/config)\n"
            "  --context NAME      the kubeconfig context (default: its current-context)\n"
            "  --namespace NS      the namespace served (default: the configuration's)\n"
            "  --all-namespaces    serve every namespace\n"
            "  --leader-elect-resource-name NAME       the Lease (default: edl-operator)\n"
            "  --leader-elect-resource-namespace NS    its namespace (default: --namespace)\n"
            "  --leader-elect-lease-duration D         (default: 15s)\n"
            "  --leader-elect-renew-deadline D         (default: 10s)\n"
            "  --leader-elect-retry-period D           (default: 2s)\n"
            "  --agent-image IMAGE the init container image that installs edl-agent into pods\n"
            "                      (default: %s)\n"
            "  --pod-etcd URLS     etcd as the pods reach it (default: --etcd); the pods get the\n"
            "                      operator's --cacert/--cert/--key through each job's Secret\n"
            "  --max-replicas N    the most pods of a job, each role and all together: a job\n"
            "                      past it is InvalidSpec (default: %d, the CRD's maximum; 1 to\n"
            "                      %d; raise the CRD's too, docs/kubernetes.md)\n"
            "\n"
            "Exit codes: 0 stopped by SIGTERM/SIGINT (after resigning) or, with --exit-when-done,\n"
            "the job succeeded; 1 the job failed; 2 usage or configuration error; 3 etcd refused\n"
            "our TLS certificate or credentials (the message names the endpoint; an unreachable\n"
            "etcd is retried for ever); 4 the job was stopped (with --exit-when-done).\n",
            EDL_DEFAULT_PREFIX, OP_DEFAULT_AGENT_IMAGE, EDL_TJ_PODS_MAX, EDL_MEMBERS_MAX);
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

/* A duration flag (--leader-elect-*): "15s", "500ms". */
static int duration_option(const char *flag, const char *value, int64_t *ms)
{
    if (edl_duration_parse(value, ms) == 0 && *ms > 0)
        return 0;
    fprintf(stderr, "edl-jobserver: --%s %s: expected a duration like 15s or 500ms\n", flag,
            value);
    return -1;
}

typedef struct k8s_options {
    bool on, all_namespaces;
    const char *kubeconfig, *context, *ns;
    op_config op;
    int64_t lease_ms, renew_ms, retry_ms;
} k8s_options;

/* The operator: its Kubernetes configuration, then op_run. */
static int run_operator(k8s_options *ko, const js_config *cfg)
{
    edl_k8s_config kc = {0};
    char err[600];
    if (edl_k8s_config_load(&kc, ko->kubeconfig, ko->context, err, sizeof err) != 0) {
        fprintf(stderr, "edl-jobserver: %s\n", err);
        edl_k8s_config_clear(&kc);
        return EDL_EXIT_USAGE;
    }
    op_config *oc = &ko->op;
    oc->etcd = cfg->etcd;
    oc->k8s = &kc;
    oc->prefix = cfg->prefix;
    oc->id = cfg->id;
    oc->ttl_s = cfg->ttl_s;
    oc->metrics_port = cfg->metrics_port;
    oc->metrics_addr = cfg->metrics_addr;
    oc->ns = ko->all_namespaces ? NULL : ko->ns ? ko->ns : kc.namespace ? kc.namespace : "default";
    if (!oc->lease_ns)
        oc->lease_ns = ko->ns ? ko->ns : kc.namespace ? kc.namespace : "default";
    oc->lease_duration_s = (int)((ko->lease_ms + 999) / 1000);
    oc->renew_deadline_ms = (int)ko->renew_ms;
    oc->retry_period_ms = (int)ko->retry_ms;
    int rc = op_run(oc);
    edl_k8s_config_clear(&kc);
    return rc;
}

enum { OPT_K8S = 1000, OPT_KUBECONFIG, OPT_CONTEXT, OPT_NS, OPT_ALLNS, OPT_LNAME, OPT_LNS,
       OPT_LDUR, OPT_LRENEW, OPT_LRETRY, OPT_IMAGE, OPT_PODETCD, OPT_MAXREP };

static const struct option LONG_OPTIONS[] = {
    EDL_ETCD_LONG_OPTIONS,                 {"job", required_argument, 0, 'j'},
    {"prefix", required_argument, 0, 'p'}, {"id", required_argument, 0, 'i'},
    {"ttl", required_argument, 0, 't'},    {"exit-when-done", no_argument, 0, 'x'},
    {"metrics-port", required_argument, 0, 'm'}, {"metrics-addr", required_argument, 0, 'M'},
    {"log-level", required_argument, 0, 'l'}, {"help", no_argument, 0, 'h'},
    {"kubernetes", no_argument, 0, OPT_K8S}, {"kubeconfig", required_argument, 0, OPT_KUBECONFIG},
    {"context", required_argument, 0, OPT_CONTEXT}, {"namespace", required_argument, 0, OPT_NS},
    {"all-namespaces", no_argument, 0, OPT_ALLNS},
    {"leader-elect-resource-name", required_argument, 0, OPT_LNAME},
    {"leader-elect-resource-namespace", required_argument, 0, OPT_LNS},
    {"leader-elect-lease-duration", required_argument, 0, OPT_LDUR},
    {"leader-elect-renew-deadline", required_argument, 0, OPT_LRENEW},
    {"leader-elect-retry-period", required_argument, 0, OPT_LRETRY},
    {"agent-image", required_argument, 0, OPT_IMAGE}, {"pod-etcd", required_argument, 0, OPT_PODETCD},
    {"max-replicas", required_argument, 0, OPT_MAXREP},
    {0, 0, 0, 0},
};

/* The Kubernetes flags; 0, or -1 after saying why. */
static int k8s_option(k8s_options *ko, int ch, const char *name, const char *value)
{
    switch (ch) {
    case OPT_K8S: ko->on = true; return 0;
    case OPT_KUBECONFIG: ko->kubeconfig = value; return 0;
    case OPT_CONTEXT: ko->context = value; return 0;
    case OPT_NS: ko->ns = value; return 0;
    case OPT_ALLNS: ko->all_namespaces = true; return 0;
    case OPT_LNAME: ko->op.lease_name = value; return 0;
    case OPT_LNS: ko->op.lease_ns = value; return 0;
    case OPT_LDUR: return duration_option(name, value, &ko->lease_ms);
    case OPT_LRENEW: return duration_option(name, value, &ko->renew_ms);
    case OPT_LRETRY: return duration_option(name, value, &ko->retry_ms);
    case OPT_IMAGE: ko->op.agent_image = value; return 0;
    case OPT_PODETCD: ko->op.pod_etcd_endpoints = value; return 0;
    case OPT_MAXREP: {
        long v;
        if (parse_int(value, 1, EDL_MEMBERS_MAX, &v) == 0) {
            ko->op.max_replicas = (int)v;
            return 0;
        }
        fprintf(stderr, "edl-jobserver: --%s %s: expected a number of pods, 1 to %d\n", name,
                value, EDL_MEMBERS_MAX);
        return -1;
    }
    }
    return -1;
}

int main(int argc, char **argv)
{
    const struct option *opts = LONG_OPTIONS;
    edl_log_setup_from_env();
    js_config cfg = {.job = getenv("EDL_JOB_ID"), .prefix = EDL_DEFAULT_PREFIX, .ttl_s = 10};
    k8s_options ko = {.lease_ms = 15000, .renew_ms = 10000, .retry_ms = 2000,
                      .op = {.lease_name = "edl-operator", .agent_image = OP_DEFAULT_AGENT_IMAGE,
                             .max_replicas = EDL_TJ_PODS_MAX}};
    static edl_etcd_config etcd; /* static: still reachable on the early returns */
    edl_etcd_config_init(&etcd);
    cfg.etcd = &etcd;
    char idbuf[300];
    int ch, idx = 0;
    long v;
    while ((ch = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
        if (ch >= OPT_K8S && ch <= OPT_MAXREP) {
            if (k8s_option(&ko, ch, opts[idx].name, optarg))
                return EDL_EXIT_USAGE;
            continue;
        }
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
            if (parse_int(optarg, 0, 65535, &v)) {
                fprintf(stderr, "edl-jobserver: --metrics-port %s: expected a port, 0 to 65535\n",
                        optarg);
                return EDL_EXIT_USAGE;
            }
            cfg.metrics_port = (int)v;
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
    if (etcd.n_endpoints == 0 || (!cfg.job && !ko.on)) {
        fprintf(stderr, "edl-jobserver: %s is required (see --help)\n",
                etcd.n_endpoints == 0 ? "--etcd" : "--job (or --kubernetes)");
        return EDL_EXIT_USAGE;
    }
    if (ko.on && cfg.job && getenv("EDL_JOB_ID") != cfg.job) {
        fprintf(stderr, "edl-jobserver: --kubernetes serves every TrainingJob: drop --job\n");
        return EDL_EXIT_USAGE;
    }
    if (cfg.metrics_addr && !edl_metrics_addr_valid(cfg.metrics_addr)) {
        fprintf(stderr, "edl-jobserver: --metrics-addr %s: expected an IPv4 or IPv6 address\n",
                cfg.metrics_addr);
        return EDL_EXIT_USAGE;
    }
    if (!ko.on && !edl_name_valid(cfg.job)) {
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
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL); /* before any thread: they all inherit the mask */
    signal(SIGPIPE, SIG_IGN);
    int rc = ko.on ? run_operator(&ko, &cfg) : js_run(&cfg); /* their loops take the signals */
    edl_etcd_config_clear(&etcd);
    return rc;
}
