/* service.c: `edl service register|list|deregister`: teachers for distillation by hand. A server
 * started anywhere (a Deployment, a notebook, another cluster) becomes a teacher of a service
 * with `edl service register`; with --ttl the command holds the registration's lease in the
 * foreground and deregisters on SIGTERM or SIGINT, so the teacher vanishes if this command or
 * its machine dies. Keys and records: include/edl/discovery.h, docs/distill.md. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "edl/discovery.h"
#include "edl/json.h"
#include "edl/loop.h"

static const char service_usage[] =
    "Usage: edl service register --service NAME --instance NAME --endpoint URL [--capacity N]\n"
    "                            [--model M] [--version V] [--ttl SECONDS]\n"
    "       edl service list --service NAME [-o table|json]\n"
    "       edl service deregister --service NAME --instance NAME\n"
    "Teachers of a distillation service, in etcd under PREFIX/services/NAME/teachers/INSTANCE.\n"
    "register puts the teacher's record: its endpoint (http:// or https://), capacity (the\n"
    "students it serves at once, 1..65535, default 1), model and version. Without --ttl the\n"
    "record stays until deregistered; with --ttl it is held under a lease of that many seconds\n"
    "while this command runs, and deleted when it gets SIGTERM or SIGINT (or, if it dies, when\n"
    "the lease runs out). list prints the teachers (-o json: a JSON array); deregister deletes\n"
    "one. Names are 1-63 of [a-z0-9-].\n"
    "\nOptions:\n"
    "  --prefix PREFIX       etcd key prefix (" EDL_DEFAULT_PREFIX ")\n"
    "  --job NAME            use the etcd of this job, which edl run runs on this machine (as\n"
    "                        edl status finds it); without it and without --etcd or\n"
    "                        EDL_ETCD_ENDPOINTS: the etcd of the one job edl run runs here\n"
    EDL_ETCD_OPTIONS_HELP
    "\nExit codes: 0 done, 1 no such teacher (deregister), 2 usage or invalid settings, 3 etcd\n"
    "unreachable or it refused our TLS certificate or credentials.\n";

typedef struct service_args {
    cli_common co;
    const char *service, *instance, *output, *job;
    edl_service_instance in;
    long ttl_s;
} service_args;

static int bad_usage(service_args *a, const char *why, const char *arg)
{
    if (why)
        fprintf(stderr, "edl service: %s%s%s%s\n", why, arg ? " \"" : "", arg ? arg : "",
                arg ? "\"" : "");
    fprintf(stderr, "%s", service_usage);
    edl_etcd_config_clear(&a->co.etcd);
    return EDL_EXIT_USAGE;
}

static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    *out = strtol(s, &end, 10);
    return *s && !*end && *out >= lo && *out <= hi;
}

/* One option of the table below: 0, or an exit code after saying why. */
static int service_option(service_args *a, int ch, const char *name, const char *arg)
{
    long v;
    switch (ch) {
    case EDL_ETCD_OPT: return cli_etcd_option(&a->co.etcd, name, arg) ? bad_usage(a, NULL, NULL) : 0;
    case 'p': a->co.prefix = arg; return 0;
    case 's': a->service = arg; return 0;
    case 'i': a->instance = arg; return 0;
    case 'e': a->in.endpoint = (char *)arg; return 0;
    case 'm': a->in.model = (char *)arg; return 0;
    case 'v': a->in.version = (char *)arg; return 0;
    case 'o': a->output = arg; return 0;
    case 'j': a->job = arg; return 0;
    case 'c':
        if (!parse_long(arg, 1, 65535, &v))
            return bad_usage(a, "--capacity takes 1..65535, got", arg);
        a->in.capacity = (int)v;
        return 0;
    case 't':
        if (!parse_long(arg, 1, 3600, &v))
            return bad_usage(a, "--ttl takes 1..3600 seconds, got", arg);
        a->ttl_s = v;
        return 0;
    case 'h':
        printf("%s", service_usage);
        edl_etcd_config_clear(&a->co.etcd);
        exit(0);
    default: return bad_usage(a, NULL, NULL);
    }
}

static int parse_service_args(int argc, char **argv, service_args *a)
{
    static const struct option opts[] = {
        EDL_ETCD_LONG_OPTIONS,
        {"prefix", required_argument, 0, 'p'},   {"service", required_argument, 0, 's'},
        {"instance", required_argument, 0, 'i'}, {"endpoint", required_argument, 0, 'e'},
        {"capacity", required_argument, 0, 'c'}, {"model", required_argument, 0, 'm'},
        {"version", required_argument, 0, 'v'},  {"ttl", required_argument, 0, 't'},
        {"output", required_argument, 0, 'o'},   {"help", no_argument, 0, 'h'},
        {"job", required_argument, 0, 'j'},
        {0, 0, 0, 0},
    };
    a->co.prefix = EDL_DEFAULT_PREFIX;
    a->in.capacity = 1;
    a->output = "table";
    edl_etcd_config_init(&a->co.etcd);
    int ch, idx = 0, rc;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "ho:", opts, &idx)) != -1)
        if ((rc = service_option(a, ch, ch == EDL_ETCD_OPT ? opts[idx].name : NULL, optarg)))
            return rc;
    if (optind != argc)
        return bad_usage(a, "unexpected argument", argv[optind]);
    if (a->job && !edl_name_valid(a->job))
        return bad_usage(a, "--job needs a job name of 1-128 [A-Za-z0-9._-], got", a->job);
    if (!edl_prefix_valid(a->co.prefix))
        return bad_usage(a, "--prefix " EDL_PREFIX_RULE ", got", a->co.prefix);
    if (!a->service || !edl_service_name_ok(a->service))
        return bad_usage(a, "--service needs a name of 1-63 [a-z0-9-], got",
                         a->service ? a->service : "");
    return 0;
}

/* A client from the flags, else EDL_ETCD_*, else a local job's state file (--job, else the
 * only job edl run runs here), as edl status finds it: an exit code after saying why. */
static int service_connect(service_args *a, edl_etcd **c)
{
    return cli_connect(&a->co, a->job, c);
}

static int etcd_failed(edl_etcd *c, const char *what, int rc)
{
    fprintf(stderr, "edl service: %s: %s (%s)%s%s\n", what, edl_strerror(rc), edl_etcd_errmsg(c),
            *edl_etcd_advice(rc) ? "; " : "", edl_etcd_advice(rc));
    return EDL_EXIT_UNREACHABLE;
}

/* ---- register -------------------------------------------------------------------------------- */

/* Put the record under a fresh lease and keep it alive: 0 or an EDL_E* code. */
static int register_leased(edl_etcd *c, const service_args *a, edl_lease_keeper **k)
{
    int64_t lease = 0;
    int rc = edl_etcd_lease_grant(c, a->ttl_s, 0, &lease, NULL);
    if (!rc)
        rc = edl_service_register(c, a->co.prefix, a->service, &a->in, lease);
    if (!rc)
        rc = edl_lease_keeper_open(c, lease, a->ttl_s, NULL, NULL, k);
    if (rc && lease)
        edl_etcd_lease_revoke(c, lease);
    return rc;
}

/* A registration held on a loop: its keeper, and when to take a lost lease again. */
typedef struct holder {
    edl_etcd *c;
    const service_args *a;
    edl_lease_keeper *k;      /* NULL: the lease was lost */
    int64_t retry_ms;         /* register again then (0: registered) */
} holder;

static void on_signal(edl_loop *l, int sig, void *arg)
{
    (void)sig, (void)arg;
    edl_loop_stop(l, 0);
}

static int keeper_fd(void *arg, int *events)
{
    (void)events;
    const holder *h = arg;
    return h->k ? edl_lease_keeper_fd(h->k) : -1;
}

static void on_keeper(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events;
    holder *h = arg;
    if (!h->k || edl_lease_keeper_status(h->k) == 0)
        return;
    fprintf(stderr, "edl service: the lease of %s was lost (%s): registering again\n",
            h->a->instance, edl_strerror(edl_lease_keeper_status(h->k)));
    edl_lease_keeper_close(h->k, false);
    h->k = NULL;
    h->retry_ms = edl_monotonic_ms();
}

static void on_retry(edl_loop *l, void *arg)
{
    (void)l;
    holder *h = arg;
    if (register_leased(h->c, h->a, &h->k) != 0) {
        h->retry_ms = edl_monotonic_ms() + 1000;
        return;
    }
    h->retry_ms = 0;
    fprintf(stderr, "edl service: %s registered again\n", h->a->instance);
}

/* Hold the registration until SIGTERM or SIGINT (on the loop's signalfd); a lost lease (etcd
 * away for a whole TTL) is taken again every second. Deregisters before returning. */
static int hold_registration(edl_loop *l, holder *h)
{
    int rc = edl_loop_fd_follow(l, keeper_fd, on_keeper, h);
    rc = rc ? rc : edl_loop_timer_add(l, &h->retry_ms, on_retry, h);
    if (!rc)
        edl_loop_run(l);
    rc = edl_service_deregister(h->c, h->a->co.prefix, h->a->service, h->a->instance);
    if (h->k)
        edl_lease_keeper_close(h->k, true);
    if (rc && rc != EDL_ENOTFOUND)
        return etcd_failed(h->c, "deregistering", rc);
    printf("deregistered %s from service %s\n", h->a->instance, h->a->service);
    return 0;
}

static int service_register(edl_etcd *c, service_args *a)
{
    a->in.name = (char *)a->instance;
    char *json = NULL;
    if (edl_service_instance_to_json(&a->in, &json) != 0) {
        fprintf(stderr, "edl service register: --endpoint must be an http:// or https:// URL with "
                        "a host, --model and --version at most 256 bytes\n");
        return EDL_EXIT_USAGE;
    }
    free(json);
    if (!a->ttl_s) {
        int rc = edl_service_register(c, a->co.prefix, a->service, &a->in, 0);
        if (rc)
            return etcd_failed(c, "registering", rc);
        printf("registered %s (%s) in service %s, until deregistered\n", a->instance,
               a->in.endpoint, a->service);
        return 0;
    }
    holder h = {.c = c, .a = a};
    edl_loop *l = NULL;
    int rc = edl_loop_open(-1, &l);
    /* the signals before the lease: a signal now still deregisters */
    rc = rc ? rc : edl_loop_signals(l, EDL_SIGNALS_STOP, on_signal, &h);
    rc = rc ? rc : register_leased(c, a, &h.k);
    if (rc) {
        edl_loop_free(l);
        return etcd_failed(c, "registering", rc);
    }
    printf("registered %s (%s) in service %s under a %lds lease; SIGTERM or Ctrl-C deregisters\n",
           a->instance, a->in.endpoint, a->service, a->ttl_s);
    fflush(stdout);
    rc = hold_registration(l, &h);
    edl_loop_free(l);
    return rc;
}

/* ---- list and deregister --------------------------------------------------------------------- */

static void print_json(const edl_service_instance *l, size_t n)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        char lease[24];
        snprintf(lease, sizeof lease, "%" PRId64, l[i].lease);
        cJSON_AddStringToObject(o, "instance", l[i].name);
        cJSON_AddStringToObject(o, "endpoint", l[i].endpoint);
        cJSON_AddNumberToObject(o, "capacity", l[i].capacity);
        cJSON_AddStringToObject(o, "model", l[i].model);
        cJSON_AddStringToObject(o, "version", l[i].version);
        cJSON_AddNumberToObject(o, "load", l[i].load);
        cJSON_AddStringToObject(o, "lease", lease); /* 64 bits: a JSON number would round it */
        cJSON_AddItemToArray(arr, o);
    }
    char *text = edl_json_print(arr, true);
    printf("%s\n", text ? text : "[]");
    free(text);
    cJSON_Delete(arr);
}

static int service_list(edl_etcd *c, const service_args *a)
{
    edl_service_instance *l;
    size_t n;
    int rc = edl_service_list(c, a->co.prefix, a->service, &l, &n, NULL);
    if (rc)
        return etcd_failed(c, "listing", rc);
    if (!strcmp(a->output, "json")) {
        print_json(l, n);
    } else {
        printf("%-24s %-32s %8s %-12s %-10s %6s\n", "INSTANCE", "ENDPOINT", "CAPACITY", "MODEL",
               "VERSION", "LOAD");
        for (size_t i = 0; i < n; i++)
            printf("%-24s %-32s %8d %-12s %-10s %6.2f\n", l[i].name, l[i].endpoint,
                   l[i].capacity, *l[i].model ? l[i].model : "-",
                   *l[i].version ? l[i].version : "-", l[i].load);
    }
    edl_service_list_free(l, n);
    return 0;
}

static int service_deregister(edl_etcd *c, const service_args *a)
{
    int rc = edl_service_deregister(c, a->co.prefix, a->service, a->instance);
    if (rc == EDL_ENOTFOUND) {
        fprintf(stderr, "edl service deregister: no teacher %s in service %s\n", a->instance,
                a->service);
        return EDL_EXIT_FAILED;
    }
    if (rc)
        return etcd_failed(c, "deregistering", rc);
    printf("deregistered %s from service %s\n", a->instance, a->service);
    return 0;
}

int cli_service(int argc, char **argv)
{
    const char *verb = argc > 1 ? argv[1] : "";
    if (!strcmp(verb, "-h") || !strcmp(verb, "--help") || !strcmp(verb, "help")) {
        printf("%s", service_usage);
        return 0;
    }
    bool reg = !strcmp(verb, "register"), list = !strcmp(verb, "list"),
         dereg = !strcmp(verb, "deregister");
    service_args a = {0};
    if (!reg && !list && !dereg)
        return bad_usage(&a, "expected register, list or deregister, got", verb);
    int rc = parse_service_args(argc - 1, argv + 1, &a);
    if (rc)
        return rc;
    if (!list && (!a.instance || !edl_service_name_ok(a.instance)))
        return bad_usage(&a, "--instance needs a name of 1-63 [a-z0-9-], got",
                         a.instance ? a.instance : "");
    if (reg && !a.in.endpoint)
        return bad_usage(&a, "register needs --endpoint URL", NULL);
    if (list && strcmp(a.output, "json") && strcmp(a.output, "table"))
        return bad_usage(&a, "-o takes table or json, got", a.output);
    edl_etcd *c = NULL;
    if ((rc = service_connect(&a, &c)) != 0)
        return rc;
    rc = reg ? service_register(c, &a) : list ? service_list(c, &a) : service_deregister(c, &a);
    edl_etcd_close(c);
    return rc;
}
