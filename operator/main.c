/* main.c: the edl-operator command, the operator of every TrainingJob of a namespace (or of
 * the cluster): options, signals, the Kubernetes configuration, then op_run(). The job server
 * of one job is another program, edl-jobserver (jobserver/main.c). */
#include <getopt.h>
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
#include "operator.h"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: edl-operator --etcd URLS [options]\n"
            "\n"
            "The operator of TrainingJob resources (docs/kubernetes.md): keeps each job's pods,\n"
            "Service and Secret in line with its spec, decides its generations in etcd and\n"
            "reports its status. Run several replicas: one leads (a coordination.k8s.io Lease),\n"
            "the others stand by.\n"
            "\n"
            "Options:\n"
            EDL_ETCD_OPTIONS_HELP
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
            "  --agent-metrics-port P  the agents in the pods serve /metrics on port P, named\n"
            "                      edl-metrics for a PodMonitor (default: 0, off)\n"
            "  --pod-etcd URLS     etcd as the pods reach it (default: --etcd); the pods get the\n"
            "                      operator's --cacert/--cert/--key through each job's Secret\n"
            "  --max-replicas N    the most pods of a job, each role and all together: a job\n"
            "                      past it is InvalidSpec (default: %d, the CRD's maximum; 1 to\n"
            "                      %d; raise the CRD's too, docs/kubernetes.md)\n"
            "  --prefix PREFIX     etcd key prefix (default: %s)\n"
            "  --id ID             this replica's name (default: host-pid)\n"
            "  --ttl SECONDS       etcd lease of its terms on each job (default: 10)\n"
            "  --metrics-port P    serve /metrics (Prometheus) and /healthz on port P (0: off)\n"
            "  --metrics-addr ADDR the address /metrics listens on, IPv4 or IPv6 (default: 0.0.0.0)\n"
            "  --log-level LEVEL   debug, info, warn or error (default: $EDL_LOG_LEVEL or info)\n"
            "  -h, --help          this text\n"
            "\n"
            "Exit codes: 0 stopped by SIGTERM/SIGINT (after resigning); 1 the leadership was lost\n"
            "(the replica is restarted, as client-go's operators are); 2 usage or configuration\n"
            "error; 3 etcd refused our TLS certificate or credentials.\n",
            OP_DEFAULT_AGENT_IMAGE, EDL_TJ_PODS_MAX, EDL_MEMBERS_MAX, EDL_DEFAULT_PREFIX);
}

/* Everything the flags set. */
typedef struct options {
    edl_etcd_config etcd;
    bool all_namespaces;
    const char *kubeconfig, *context, *ns;
    int64_t lease_ms, renew_ms, retry_ms;
    op_config op;
} options;

/* A whole number in [lo, hi] for --flag; 0, or -1 after saying what was expected. */
static int int_option(const char *flag, const char *s, long lo, long hi, const char *what,
                      long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s && !*end && v >= lo && v <= hi) {
        *out = v;
        return 0;
    }
    fprintf(stderr, "edl-operator: --%s %s: expected %s, %ld to %ld\n", flag, s, what, lo, hi);
    return -1;
}

/* A duration flag (--leader-elect-*): "15s", "500ms". */
static int duration_option(const char *flag, const char *value, int64_t *ms)
{
    if (edl_duration_parse(value, ms) == 0 && *ms > 0)
        return 0;
    fprintf(stderr, "edl-operator: --%s %s: expected a duration like 15s or 500ms\n", flag,
            value);
    return -1;
}

enum { OPT_KUBECONFIG = 1000, OPT_CONTEXT, OPT_NS, OPT_ALLNS, OPT_LNAME, OPT_LNS, OPT_LDUR,
       OPT_LRENEW, OPT_LRETRY, OPT_IMAGE, OPT_PODETCD, OPT_MAXREP,
       OPT_AGENTMP };

static const struct option LONG_OPTIONS[] = {
    EDL_ETCD_LONG_OPTIONS,
    {"kubeconfig", required_argument, 0, OPT_KUBECONFIG},
    {"context", required_argument, 0, OPT_CONTEXT},
    {"namespace", required_argument, 0, OPT_NS},
    {"all-namespaces", no_argument, 0, OPT_ALLNS},
    {"leader-elect-resource-name", required_argument, 0, OPT_LNAME},
    {"leader-elect-resource-namespace", required_argument, 0, OPT_LNS},
    {"leader-elect-lease-duration", required_argument, 0, OPT_LDUR},
    {"leader-elect-renew-deadline", required_argument, 0, OPT_LRENEW},
    {"leader-elect-retry-period", required_argument, 0, OPT_LRETRY},
    {"agent-image", required_argument, 0, OPT_IMAGE},
    {"pod-etcd", required_argument, 0, OPT_PODETCD},
    {"max-replicas", required_argument, 0, OPT_MAXREP},
    {"agent-metrics-port", required_argument, 0, OPT_AGENTMP},
    {"prefix", required_argument, 0, 'p'},
    {"id", required_argument, 0, 'i'},
    {"ttl", required_argument, 0, 't'},
    {"metrics-port", required_argument, 0, 'm'},
    {"metrics-addr", required_argument, 0, 'M'},
    {"log-level", required_argument, 0, 'l'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* One flag; 0, or -1 after saying why. */
static int option(options *o, int ch, const char *name, const char *value)
{
    char err[600];
    long v;
    edl_log_level lv;
    switch (ch) {
    case EDL_ETCD_OPT:
        if (edl_etcd_config_set_option(&o->etcd, name, value, err, sizeof err) == 0)
            return 0;
        fprintf(stderr, "edl-operator: %s\n", err);
        return -1;
    case OPT_KUBECONFIG: o->kubeconfig = value; return 0;
    case OPT_CONTEXT: o->context = value; return 0;
    case OPT_NS: o->ns = value; return 0;
    case OPT_ALLNS: o->all_namespaces = true; return 0;
    case OPT_LNAME: o->op.lease_name = value; return 0;
    case OPT_LNS: o->op.lease_ns = value; return 0;
    case OPT_LDUR: return duration_option(name, value, &o->lease_ms);
    case OPT_LRENEW: return duration_option(name, value, &o->renew_ms);
    case OPT_LRETRY: return duration_option(name, value, &o->retry_ms);
    case OPT_IMAGE: o->op.agent_image = value; return 0;
    case OPT_PODETCD: o->op.pod_etcd_endpoints = value; return 0;
    case OPT_MAXREP:
        if (int_option(name, value, 1, EDL_MEMBERS_MAX, "a number of pods", &v))
            return -1;
        o->op.max_replicas = (int)v;
        return 0;
    case OPT_AGENTMP:
        if (int_option(name, value, 0, 65535, "a port", &v))
            return -1;
        o->op.agent_metrics_port = (int)v;
        return 0;
    case 'p':
        if (edl_prefix_valid(value)) {
            o->op.prefix = value;
            return 0;
        }
        fprintf(stderr, "edl-operator: --prefix '%s': " EDL_PREFIX_RULE "\n", value);
        return -1;
    case 'i': o->op.id = value; return 0;
    case 't':
        if (int_option(name, value, 1, 86400, "whole seconds", &v))
            return -1;
        o->op.ttl_s = v;
        return 0;
    case 'm':
        if (int_option(name, value, 0, 65535, "a port", &v))
            return -1;
        o->op.metrics_port = (int)v;
        return 0;
    case 'M': o->op.metrics_addr = value; return 0;
    case 'l':
        if (edl_log_level_parse(value, &lv) == 0) {
            edl_log_setup(lv, EDL_LOG_PLAIN, NULL);
            return 0;
        }
        fprintf(stderr, "edl-operator: --log-level %s: expected debug, info, warn or error\n",
                value);
        return -1;
    }
    return -1;
}

/* The settings not given as flags (the environment's etcd), then checked; 0 or -1. */
static int check_options(options *o)
{
    char err[600];
    if (edl_etcd_config_from_env(&o->etcd, err, sizeof err) != 0 ||
        edl_etcd_config_check(&o->etcd, err, sizeof err) != 0) {
        fprintf(stderr, "edl-operator: %s\n", err);
        return -1;
    }
    if (o->etcd.n_endpoints == 0) {
        fprintf(stderr, "edl-operator: --etcd is required (see --help)\n");
        return -1;
    }
    if (o->op.metrics_addr && !edl_metrics_addr_valid(o->op.metrics_addr)) {
        fprintf(stderr, "edl-operator: --metrics-addr %s: expected an IPv4 or IPv6 address\n",
                o->op.metrics_addr);
        return -1;
    }
    return 0;
}

/* The Kubernetes configuration, then op_run until a signal or a lost leadership. */
static int run(options *o)
{
    edl_k8s_config kc = {0};
    char err[600];
    if (edl_k8s_config_load(&kc, o->kubeconfig, o->context, err, sizeof err) != 0) {
        fprintf(stderr, "edl-operator: %s\n", err);
        edl_k8s_config_clear(&kc);
        return EDL_EXIT_USAGE;
    }
    op_config *oc = &o->op;
    const char *ns = o->ns ? o->ns : kc.namespace ? kc.namespace : "default";
    oc->etcd = &o->etcd;
    oc->k8s = &kc;
    oc->ns = o->all_namespaces ? NULL : ns;
    if (!oc->lease_ns)
        oc->lease_ns = ns;
    oc->lease_duration_s = (int)((o->lease_ms + 999) / 1000);
    oc->renew_deadline_ms = (int)o->renew_ms;
    oc->retry_period_ms = (int)o->retry_ms;
    int rc = op_run(oc);
    edl_k8s_config_clear(&kc);
    return rc;
}

int main(int argc, char **argv)
{
    edl_log_setup_from_env();
    static options o = {.lease_ms = 15000, .renew_ms = 10000, .retry_ms = 2000,
                        .op = {.prefix = EDL_DEFAULT_PREFIX, .ttl_s = 10,
                               .lease_name = "edl-operator",
                               .agent_image = OP_DEFAULT_AGENT_IMAGE,
                               .max_replicas = EDL_TJ_PODS_MAX}};
    edl_etcd_config_init(&o.etcd); /* static: still reachable on the early returns */
    int ch, idx = 0;
    while ((ch = getopt_long(argc, argv, "h", LONG_OPTIONS, &idx)) != -1) {
        if (ch == 'h') {
            usage(stdout);
            return 0;
        }
        if (ch == '?' || ch == ':') {
            usage(stderr);
            return EDL_EXIT_USAGE;
        }
        if (option(&o, ch, LONG_OPTIONS[idx].name, optarg))
            return EDL_EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "edl-operator: unexpected argument \"%s\" (see --help)\n", argv[optind]);
        return EDL_EXIT_USAGE;
    }
    if (check_options(&o))
        return EDL_EXIT_USAGE;
    char idbuf[300];
    if (!o.op.id) {
        char host[256] = "host";
        gethostname(host, sizeof host - 1);
        snprintf(idbuf, sizeof idbuf, "%s-%d", host, (int)getpid());
        o.op.id = idbuf;
    }
    edl_loop_block_signals(EDL_SIGNALS_STOP, NULL); /* before any thread starts */
    signal(SIGPIPE, SIG_IGN);
    int rc = run(&o); /* op_run's loop takes the signals */
    edl_etcd_config_clear(&o.etcd);
    return rc;
}
