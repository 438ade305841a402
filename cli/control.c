/* control.c: `edl scale`, `edl status` and `edl stop`: small clients of a job's etcd keys.
 * scale and stop only change the spec (a txn on its revision: replicas, or with --role ps
 * ps.replicas); the launcher or operator and the job server act on it. status reads the spec,
 * the generation (members and servers), the pods and their trainers. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "edl/discovery.h"
#include "edl/json.h"

/* What every control subcommand's --help adds: the etcd settings and the exit codes. */
#define CONTROL_HELP                                                                            \
    "\nOptions to reach the job's etcd (default: the local job's, when edl run runs it):\n"      \
    EDL_ETCD_OPTIONS_HELP                                                                       \
    "\nExit codes: 0 done, 1 no such job, 2 usage or invalid settings, 3 etcd unreachable or\n" \
    "it refused our TLS certificate or credentials (the message names the endpoint).\n"

int cli_etcd_option(edl_etcd_config *etcd, const char *flag, const char *value)
{
    char err[600];
    if (edl_etcd_config_set_option(etcd, flag, value, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "edl: %s\n", err);
    return -1;
}

/* The settings: flags, else the environment, else the local job's state file; checked. */
static int resolve_etcd(edl_etcd_config *etcd, const char *job)
{
    char err[600], why[700];
    if (edl_etcd_config_from_env(etcd, err, sizeof err) != 0) {
        fprintf(stderr, "edl: %s\n", err);
        return EDL_EXIT_USAGE;
    }
    if (etcd->n_endpoints == 0 && cli_state_read(job, etcd, why, sizeof why) != 0) {
        fprintf(stderr, "edl: no etcd for job \"%s\": pass --etcd URL or set "
                        "EDL_ETCD_ENDPOINTS (%s)\n", job, why);
        return EDL_EXIT_USAGE;
    }
    if (edl_etcd_config_check(etcd, err, sizeof err) != 0) {
        fprintf(stderr, "edl: %s\n", err);
        return EDL_EXIT_USAGE;
    }
    return 0;
}

int cli_connect(cli_common *co, const char *job, edl_etcd **out)
{
    int rc = resolve_etcd(&co->etcd, job);
    if (!rc && edl_etcd_open(&co->etcd, out) != 0) {
        fprintf(stderr, "edl: invalid etcd settings for job \"%s\"\n", job);
        rc = EDL_EXIT_USAGE;
    }
    edl_etcd_config_clear(&co->etcd);
    return rc;
}

int cli_read_spec(edl_etcd *c, const edl_job_keys *k, edl_job_spec *spec, int64_t *mod)
{
    edl_kv *kv = NULL;
    int rc = edl_etcd_get(c, edl_str(k->spec), &kv, NULL);
    if (rc)
        return rc;
    char err[512];
    rc = edl_spec_parse(kv->value, kv->value_len, spec, err, sizeof err);
    if (rc)
        fprintf(stderr, "edl: %s is an invalid spec: %s\n", k->spec, err);
    if (mod)
        *mod = kv->mod_revision;
    edl_kv_free(kv);
    return rc;
}

int cli_read_generation(edl_etcd *c, const edl_job_keys *k, edl_generation *g)
{
    edl_kv *kv = NULL;
    int rc = edl_etcd_get(c, edl_str(k->generation), &kv, NULL);
    if (rc)
        return rc;
    char err[512];
    rc = edl_generation_parse(kv->value, kv->value_len, g, err, sizeof err);
    if (rc)
        fprintf(stderr, "edl: the published generation %s is unreadable: %s\n", k->generation,
                err);
    edl_kv_free(kv);
    return rc;
}

/* Write the spec if it is still at revision mod: EDL_ECONFLICT when it moved. */
static int put_spec_if(edl_etcd *c, const edl_job_keys *k, const edl_job_spec *spec, int64_t mod)
{
    char *json = edl_spec_to_json(spec);
    edl_txn *t = edl_txn_new();
    int rc = json && t ? 0 : EDL_ENOMEM;
    if (!rc) {
        edl_txn_cmp_mod(t, edl_str(k->spec), EDL_CMP_EQUAL, mod);
        edl_txn_put(t, EDL_TXN_SUCCESS, edl_str(k->spec), edl_str(json), NULL);
        edl_txn_result r;
        rc = edl_etcd_txn(c, t, &r);
        if (!rc) {
            rc = r.succeeded ? 0 : EDL_ECONFLICT;
            edl_txn_result_clear(&r);
        }
    }
    edl_txn_free(t);
    free(json);
    return rc;
}

int cli_update_spec(edl_etcd *c, const edl_job_keys *k, cli_spec_edit edit, void *arg,
                    edl_job_spec *before, edl_job_spec *after)
{
    int rc = EDL_ECONFLICT;
    for (int attempt = 0; attempt < 10 && rc == EDL_ECONFLICT; attempt++) {
        int64_t mod = 0;
        edl_spec_clear(before);
        if ((rc = cli_read_spec(c, k, before, &mod)) != 0)
            break;
        if ((rc = edl_spec_copy(after, before)) != 0)
            break;
        edit(after, arg);
        char err[256];
        if ((rc = edl_spec_validate(after, err, sizeof err)) != 0) {
            fprintf(stderr, "edl: %s\n", err);
            break;
        }
        rc = put_spec_if(c, k, after, mod);
    }
    return rc;
}

/* Parse the options every control subcommand takes (json, wait, role: NULL where the
 * subcommand has no such option); returns the index of the first operand. */
static int parse_common(int argc, char **argv, const char *usage, cli_common *co, bool *json,
                        bool *wait, const char **role)
{
    static const struct option opts[] = {
        EDL_ETCD_LONG_OPTIONS,               {"prefix", required_argument, 0, 'p'},
        {"json", no_argument, 0, 'J'},       {"no-wait", no_argument, 0, 'W'},
        {"role", required_argument, 0, 'R'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    co->prefix = EDL_DEFAULT_PREFIX;
    edl_etcd_config_init(&co->etcd);
    int ch, idx = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
        switch (ch) {
        case EDL_ETCD_OPT:
            if (cli_etcd_option(&co->etcd, opts[idx].name, optarg))
                goto bad;
            break;
        case 'p': co->prefix = optarg; break;
        case 'J':
            if (!json)
                goto bad;
            *json = true;
            break;
        case 'W':
            if (!wait)
                goto bad;
            *wait = false;
            break;
        case 'R':
            if (!role)
                goto bad;
            *role = optarg;
            break;
        case 'h':
            printf("%s%s", usage, CONTROL_HELP);
            exit(0);
        default: goto bad;
        }
    }
    return optind;
bad:
    fprintf(stderr, "%s", usage);
    edl_etcd_config_clear(&co->etcd);
    return -1;
}

/* A subcommand's job: its name, keys and a client of its etcd. */
typedef struct job_ctx {
    const char *name;
    edl_job_keys k;
    edl_etcd *c;
} job_ctx;

/* The name, keys and client; an exit code on failure (said why). Clears co->etcd. */
static int job_open(cli_common *co, const char *name, job_ctx *j)
{
    memset(j, 0, sizeof *j);
    j->name = name;
    if (edl_job_keys_init(&j->k, co->prefix, name) != 0) {
        fprintf(stderr, "edl: job name \"%s\" is not valid: use 1-128 of [A-Za-z0-9._-], not "
                        "starting with '.' or '-'\n", name);
        edl_etcd_config_clear(&co->etcd);
        return EDL_EXIT_USAGE;
    }
    int rc = cli_connect(co, name, &j->c);
    if (rc)
        edl_job_keys_clear(&j->k);
    return rc;
}

static void job_close(job_ctx *j)
{
    edl_job_keys_clear(&j->k);
    edl_etcd_close(j->c);
}

/* The common start of a subcommand that takes one JOB operand: options, the name, a client. */
static int open_job(int argc, char **argv, const char *usage, cli_common *co, bool *json,
                    bool *wait, job_ctx *j)
{
    int i = parse_common(argc, argv, usage, co, json, wait, NULL);
    if (i < 0)
        return EDL_EXIT_USAGE;
    if (argc - i != 1) {
        fprintf(stderr, "%s", usage);
        edl_etcd_config_clear(&co->etcd);
        return EDL_EXIT_USAGE;
    }
    return job_open(co, argv[i], j);
}

static int report_etcd_error(const job_ctx *j, int rc)
{
    if (rc == EDL_ENOTFOUND) {
        fprintf(stderr, "edl: no job \"%s\" in etcd\n", j->name);
        return EDL_EXIT_FAILED;
    }
    if (rc == EDL_ECONFIG)
        return EDL_EXIT_USAGE;
    fprintf(stderr, "edl: job %s: %s (%s)%s%s\n", j->name, edl_strerror(rc),
            edl_etcd_errmsg(j->c), *edl_etcd_advice(rc) ? "; " : "", edl_etcd_advice(rc));
    return EDL_EXIT_UNREACHABLE;
}

static void set_replicas(edl_job_spec *s, void *arg)
{
    s->replicas = *(int *)arg;
}

static void set_ps_replicas(edl_job_spec *s, void *arg)
{
    s->ps_replicas = *(int *)arg;
}

static void set_teacher_replicas(edl_job_spec *s, void *arg)
{
    s->teachers_replicas = *(int *)arg;
}

/* `edl scale JOB N --role teacher` on a job without teachers, or outside teachers min..max:
 * a clear refusal before any change. An exit code. */
static int check_teacher_scale(const job_ctx *j, int want)
{
    edl_job_spec sp;
    edl_spec_init(&sp);
    int rc = cli_read_spec(j->c, &j->k, &sp, NULL), ret = 0;
    if (rc)
        ret = report_etcd_error(j, rc);
    else if (sp.teachers_max == 0) {
        fprintf(stderr, "edl scale: job %s has no teacher role (no \"teachers\" in its spec): "
                        "nothing to scale; run it with edl run --teachers MIN:MAX --service "
                        "NAME\n", j->name);
        ret = EDL_EXIT_USAGE;
    } else if (want < sp.teachers_min || want > sp.teachers_max) {
        fprintf(stderr, "edl scale: job %s: %d teachers asked for, outside its teachers min..max "
                        "%d..%d; nothing changed\n", j->name, want, sp.teachers_min,
                sp.teachers_max);
        ret = EDL_EXIT_USAGE;
    }
    edl_spec_clear(&sp);
    return ret;
}

/* The replica count of `edl scale JOB N`: 0, or -1 after saying why. */
static int scale_count(const char *job, const char *s, bool ps, long *n)
{
    char *end;
    long hi = ps ? EDL_PS_SERVERS_MAX : EDL_MEMBERS_MAX;
    *n = strtol(s, &end, 10);
    if (!*s || *end || *n < 0 || *n > hi) {
        fprintf(stderr, "edl scale: expected a replica count 0..%ld, got \"%s\"\n", hi, s);
        return -1;
    }
    if (*n > CLI_LOCAL_AGENTS_MAX && cli_state_exists(job)) {
        fprintf(stderr, "edl scale: job %s runs under edl run on this machine, which starts at "
                        "most %d agents; nothing changed\n", job, CLI_LOCAL_AGENTS_MAX);
        return -1;
    }
    return 0;
}

/* `edl scale JOB N --role ps` on a job without the ps role, or beyond its ps max: a clear
 * refusal before any change (the spec's validation would refuse it too). An exit code. */
static int check_ps_scale(const job_ctx *j, int want)
{
    edl_job_spec sp;
    edl_spec_init(&sp);
    int rc = cli_read_spec(j->c, &j->k, &sp, NULL), ret = 0;
    if (rc)
        ret = report_etcd_error(j, rc);
    else if (sp.ps_max == 0) {
        fprintf(stderr, "edl scale: job %s has no ps role (no \"ps\" in its spec): nothing to "
                        "scale; run it with edl run --ps MIN:MAX\n", j->name);
        ret = EDL_EXIT_USAGE;
    } else if (want > sp.ps_max) {
        fprintf(stderr, "edl scale: job %s: %d parameter servers asked for, beyond its ps max "
                        "%d (ps replicas are 0..max); nothing changed\n", j->name, want,
                sp.ps_max);
        ret = EDL_EXIT_USAGE;
    }
    edl_spec_clear(&sp);
    return ret;
}

static void print_scaled(const job_ctx *j, int role, int want, const edl_job_spec *before,
                         const edl_job_spec *after)
{
    if (role == 2) {
        printf("job %s: teacher replicas %d -> %d", j->name, edl_spec_desired_teachers(before),
               want);
    } else if (role == 1) {
        printf("job %s: ps replicas %d -> %d", j->name, edl_spec_desired_servers(before), want);
        if (want < after->ps_min)
            printf(" (below ps min %d: the job will wait)", after->ps_min);
    } else {
        printf("job %s: replicas %d -> %d", j->name, edl_spec_desired_pods(before), want);
        if (want > after->max)
            printf(" (%d beyond max %d will wait as standbys)", want - after->max, after->max);
        if (want < after->min)
            printf(" (below min %d: the job will wait)", after->min);
    }
    printf("\n");
}

int cli_scale(int argc, char **argv)
{
    static const char usage[] =
        "Usage: edl scale JOB REPLICAS [--role worker|ps|teacher] [--etcd URLS] [--prefix P]\n"
        "Sets how many pods of a role the job should have: workers (the default: the spec's\n"
        "replicas; pods beyond the spec's max wait as standbys), with --role ps parameter\n"
        "servers (ps.replicas, 0..the job's ps max) or with --role teacher teachers\n"
        "(teachers.replicas, within the job's teachers min..max). The launcher (edl run) or\n"
        "the operator starts or stops pods to match.\n";
    cli_common co = {0};
    long n = 0;
    const char *role = EDL_ROLE_WORKER;
    int i = parse_common(argc, argv, usage, &co, NULL, NULL, &role);
    if (i < 0)
        return EDL_EXIT_USAGE;
    bool ps = strcmp(role, EDL_ROLE_PS) == 0, teacher = strcmp(role, EDL_ROLE_TEACHER) == 0;
    int r = teacher ? 2 : ps ? 1 : 0;
    int bad = argc - i != 2 || (!ps && !teacher && strcmp(role, EDL_ROLE_WORKER) != 0);
    if (bad)
        fprintf(stderr, "%s", usage);
    if (bad || scale_count(argv[i], argv[i + 1], ps || teacher, &n) != 0) {
        edl_etcd_config_clear(&co.etcd);
        return EDL_EXIT_USAGE;
    }
    job_ctx j;
    int rc = job_open(&co, argv[i], &j);
    if (rc)
        return rc;
    int want = (int)n;
    int ret = ps ? check_ps_scale(&j, want) : teacher ? check_teacher_scale(&j, want) : 0;
    static const cli_spec_edit edits[] = {set_replicas, set_ps_replicas, set_teacher_replicas};
    edl_job_spec before, after;
    edl_spec_init(&before);
    edl_spec_init(&after);
    if (!ret) {
        rc = cli_update_spec(j.c, &j.k, edits[r], &want, &before, &after);
        if (!rc)
            print_scaled(&j, r, want, &before, &after);
        ret = rc ? report_etcd_error(&j, rc) : EDL_EXIT_SUCCEEDED;
    }
    edl_spec_clear(&before);
    edl_spec_clear(&after);
    job_close(&j);
    return ret;
}

static void set_stopped(edl_job_spec *s, void *arg)
{
    (void)arg;
    s->stopped = true;
}

/* Wait up to 60 s for the job server to record the stop; an exit code. */
static int wait_stopped(const job_ctx *j)
{
    for (int t = 0; t < 600; t++) {
        edl_generation g = {0};
        int rc = cli_read_generation(j->c, &j->k, &g);
        bool final = !rc && edl_job_state_final(g.state);
        if (final)
            printf("job %s: %s (%s)\n", j->name, edl_job_state_name(g.state),
                   g.reason ? g.reason : "");
        edl_generation_clear(&g);
        if (final)
            return EDL_EXIT_SUCCEEDED;
        usleep(100 * 1000);
    }
    fprintf(stderr, "edl stop: the job server has not recorded the stop after 60 s: is it "
                    "running?\n");
    return EDL_EXIT_UNREACHABLE;
}

int cli_stop(int argc, char **argv)
{
    static const char usage[] =
        "Usage: edl stop JOB [--no-wait] [--etcd URLS] [--prefix PREFIX]\n"
        "Asks the job to stop: trainers are stopped, agents leave, and the job ends as\n"
        "\"stopped\". Waits (up to 60 s) until the job server has recorded it, unless --no-wait.\n";
    cli_common co = {0};
    bool wait = true;
    job_ctx j;
    int rc = open_job(argc, argv, usage, &co, NULL, &wait, &j);
    if (rc)
        return rc;
    edl_job_spec before, after;
    edl_spec_init(&before);
    edl_spec_init(&after);
    rc = cli_update_spec(j.c, &j.k, set_stopped, NULL, &before, &after);
    edl_spec_clear(&before);
    edl_spec_clear(&after);
    int ret = rc ? report_etcd_error(&j, rc) : EDL_EXIT_SUCCEEDED;
    if (!rc) {
        printf("job %s: stop requested\n", j.name);
        if (wait)
            ret = wait_stopped(&j);
    }
    job_close(&j);
    return ret;
}

/* ---- status ------------------------------------------------------------------------------ */

typedef struct job_view {
    edl_job_spec spec;
    bool have_spec;
    edl_generation gen;
    bool have_gen;
    edl_pod *pods;
    size_t n_pods;
    edl_pod_status *st;
    bool *has_st;
    size_t n_bad; /* keys under pods/ that are no valid pod name: ignored */
    edl_service_instance *teachers; /* the teachers' service's records (spec.teachers) */
    size_t n_teachers;
} job_view;

static void view_free(job_view *v)
{
    edl_spec_clear(&v->spec);
    edl_generation_clear(&v->gen);
    for (size_t i = 0; i < v->n_pods; i++)
        edl_pod_clear(&v->pods[i]);
    free(v->pods);
    free(v->st);
    free(v->has_st);
    edl_service_list_free(v->teachers, v->n_teachers);
}

/* The records in the service of the job's teachers (none without the teacher role). */
static int read_teachers(edl_etcd *c, const char *prefix, job_view *v)
{
    if (!v->have_spec || v->spec.teachers_max == 0)
        return 0;
    int64_t rev;
    return edl_service_list(c, prefix, v->spec.teachers_service, &v->teachers, &v->n_teachers,
                            &rev);
}

static void print_teachers(const job_view *v)
{
    if (!v->have_spec || v->spec.teachers_max == 0)
        return;
    printf("teachers: %zu registered in service %s (min %d, max %d, replicas %d)\n",
           v->n_teachers, v->spec.teachers_service, v->spec.teachers_min, v->spec.teachers_max,
           edl_spec_desired_teachers(&v->spec));
    if (v->n_teachers)
        printf("%-24s %-28s %-6s %-8s %s\n", "INSTANCE", "ENDPOINT", "LOAD", "CAPACITY",
               "MODEL");
    for (size_t i = 0; i < v->n_teachers; i++) {
        const edl_service_instance *t = &v->teachers[i];
        printf("%-24s %-28s %-6.2f %-8d %s%s%s\n", t->name, t->endpoint, t->load, t->capacity,
               t->model, t->version && *t->version ? ":" : "", t->version ? t->version : "");
    }
}

static int read_pods(edl_etcd *c, const edl_job_keys *k, job_view *v)
{
    const char *kp = k->pods, *ks = k->status;
    edl_range_opts o = {.prefix = true, .sort_order = EDL_SORT_ASCEND,
                        .sort_target = EDL_SORT_CREATE};
    edl_range_result rp = {0}, rs = {0};
    int rc = edl_etcd_range(c, edl_str(kp), &o, &rp);
    if (!rc)
        rc = edl_etcd_range(c, edl_str(ks), &o, &rs);
    if (!rc) {
        v->pods = calloc(rp.n_kvs + 1, sizeof *v->pods);
        v->st = calloc(rp.n_kvs + 1, sizeof *v->st);
        v->has_st = calloc(rp.n_kvs + 1, sizeof *v->has_st);
        rc = (v->pods && v->st && v->has_st) ? 0 : EDL_ENOMEM;
    }
    for (size_t i = 0; !rc && i < rp.n_kvs; i++) {
        edl_pod *p = &v->pods[v->n_pods];
        char err[256];
        if (!edl_name_valid(rp.kvs[i].key + strlen(kp))) {
            v->n_bad++; /* not a registration any agent writes */
            continue;
        }
        p->name = strdup(rp.kvs[i].key + strlen(kp));
        p->lease = rp.kvs[i].lease;
        if (!p->name || edl_pod_parse(rp.kvs[i].value, rp.kvs[i].value_len, p, err, sizeof err)) {
            edl_pod_clear(p);
            continue;
        }
        for (size_t j = 0; j < rs.n_kvs; j++)
            if (strcmp(rs.kvs[j].key + strlen(ks), p->name) == 0 &&
                edl_pod_status_parse(rs.kvs[j].value, rs.kvs[j].value_len, &v->st[v->n_pods],
                                     err, sizeof err) == 0)
                v->has_st[v->n_pods] = true;
        v->n_pods++;
    }
    edl_range_result_clear(&rp);
    edl_range_result_clear(&rs);
    return rc;
}

/* The RANK column: a worker's rank, "ps N" for a server, standby, excluded or "-". */
static const char *role_of(const job_view *v, const edl_pod *p, char *buf, size_t n)
{
    const edl_member *m = v->have_gen ? edl_generation_member(&v->gen, p->name, p->lease) : NULL;
    const edl_member *s = v->have_gen ? edl_generation_server(&v->gen, p->name, p->lease) : NULL;
    if (m || s) {
        snprintf(buf, n, s ? "ps %d" : "%d", s ? s->rank : m->rank);
        return buf;
    }
    for (size_t i = 0; v->have_gen && i < v->gen.n_standbys; i++)
        if (strcmp(v->gen.standbys[i], p->name) == 0)
            return "standby";
    for (size_t i = 0; v->have_gen && i < v->gen.n_failures; i++)
        if (strcmp(v->gen.failures[i].pod, p->name) == 0 &&
            v->gen.failures[i].excluded_until > (int64_t)time(NULL) * 1000)
            return "excluded";
    return "-";
}

static void print_table(const char *job, const job_view *v)
{
    if (!v->have_gen) {
        printf("job %s: no generation yet (%zu pods registered)\n", job, v->n_pods);
    } else {
        printf("job %s: %s, generation %lld, %zu members, ", job,
               edl_job_state_name(v->gen.state), (long long)v->gen.generation, v->gen.n_members);
        if (v->gen.n_servers || (v->have_spec && v->spec.ps_max > 0))
            printf("%zu servers, ", v->gen.n_servers);
        printf("%d restarts\n", v->gen.restarts);
        if (v->gen.reason && *v->gen.reason)
            printf("reason: %s\n", v->gen.reason);
        if (v->gen.spec_error)
            printf("SPEC ERROR (the last valid spec stays in force): %s\n", v->gen.spec_error);
    }
    if (v->have_spec && v->spec.ps_max > 0)
        printf("spec: min %d, max %d, replicas %d; ps min %d, max %d, replicas %d%s\n",
               v->spec.min, v->spec.max, edl_spec_desired_pods(&v->spec), v->spec.ps_min,
               v->spec.ps_max, edl_spec_desired_servers(&v->spec),
               v->spec.stopped ? ", stop requested" : "");
    else if (v->have_spec)
        printf("spec: min %d, max %d, replicas %d%s\n", v->spec.min, v->spec.max,
               edl_spec_desired_pods(&v->spec),
               v->spec.stopped ? ", stop requested" : "");
    if (v->n_bad)
        printf("(%zu keys under pods/ are no valid pod name: ignored)\n", v->n_bad);
    printf("%-6s %-24s %-22s %-9s %-6s %-8s %-8s %s\n", "RANK", "POD", "ENDPOINT", "TRAINER",
           "GEN", "STEP", "RESTARTS", "METRICS");
    for (size_t i = 0; i < v->n_pods; i++) {
        const edl_pod *p = &v->pods[i];
        char rk[16], ep[300], state[32] = "-", gen[24] = "-", step[24] = "-", rs[24] = "-";
        char metrics[300] = "-";
        snprintf(ep, sizeof ep, "%s:%d", p->addr, p->port);
        if (p->metrics_port) /* the agent listens on every address unless told one */
            snprintf(metrics, sizeof metrics, "http://%s:%d/metrics", p->addr, p->metrics_port);
        if (v->has_st[i]) {
            const edl_pod_status *s = &v->st[i];
            if (s->state == EDL_TRAINER_EXITED)
                snprintf(state, sizeof state, "exit(%d)", s->exit_code);
            else if (s->state == EDL_TRAINER_SIGNALED)
                snprintf(state, sizeof state, "signal(%d)", s->signal);
            else
                snprintf(state, sizeof state, "%s", edl_trainer_state_name(s->state));
            snprintf(gen, sizeof gen, "%lld", (long long)s->generation);
            if (s->step >= 0)
                snprintf(step, sizeof step, "%lld", (long long)s->step);
            snprintf(rs, sizeof rs, "%lld", (long long)s->restarts);
        }
        printf("%-6s %-24s %-22s %-9s %-6s %-8s %-8s %s\n", role_of(v, p, rk, sizeof rk),
               p->name, ep, state, gen, step, rs, metrics);
    }
    for (size_t i = 0; i < v->n_pods; i++) /* what trainers said (their error, why they hung) */
        if (v->has_st[i] && v->st[i].message[0])
            printf("%s: %s\n", v->pods[i].name, v->st[i].message);
    print_teachers(v);
}

/* A document of ours as a JSON value inside the output (null when absent). */
static cJSON *json_doc(char *text)
{
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    return o ? o : cJSON_CreateNull();
}

/* One JSON object, built as a tree: names that come from etcd keys are escaped like any string. */
static void print_json(const job_view *v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "spec", json_doc(v->have_spec ? edl_spec_to_json(&v->spec) : NULL));
    cJSON_AddItemToObject(o, "generation",
                          json_doc(v->have_gen ? edl_generation_to_json(&v->gen) : NULL));
    cJSON *pods = cJSON_AddArrayToObject(o, "pods");
    for (size_t i = 0; i < v->n_pods; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "name", v->pods[i].name);
        cJSON_AddItemToObject(p, "pod", json_doc(edl_pod_to_json(&v->pods[i])));
        cJSON_AddItemToObject(p, "status", json_doc(v->has_st[i] ?
                                                    edl_pod_status_to_json(&v->st[i]) : NULL));
        cJSON_AddItemToArray(pods, p);
    }
    cJSON *ts = cJSON_AddArrayToObject(o, "teachers");
    for (size_t i = 0; i < v->n_teachers; i++) {
        char *rec = NULL;
        cJSON *t = edl_service_instance_to_json(&v->teachers[i], &rec) == 0 ? cJSON_Parse(rec)
                                                                             : NULL;
        free(rec);
        if (t) {
            cJSON_AddStringToObject(t, "instance", v->teachers[i].name);
            cJSON_AddItemToArray(ts, t);
        }
    }
    char *text = edl_json_print_consume(o);
    printf("%s\n", text ? text : "null");
    free(text);
}

int cli_status(int argc, char **argv)
{
    static const char usage[] =
        "Usage: edl status JOB [--json] [--etcd URLS] [--prefix PREFIX]\n"
        "Shows the job's state, generation, members with their ranks, parameter servers\n"
        "(RANK \"ps N\"), each trainer, and the teachers registered in the service of the\n"
        "job's teachers (instance, endpoint, load); --json: the spec, generation (with\n"
        "\"servers\"), pods (with their role) and teachers as one JSON object.\n";
    cli_common co = {0};
    bool json = false;
    job_ctx j;
    int rc = open_job(argc, argv, usage, &co, &json, NULL, &j);
    if (rc)
        return rc;
    job_view v = {0};
    edl_spec_init(&v.spec);
    rc = cli_read_spec(j.c, &j.k, &v.spec, NULL);
    v.have_spec = rc == 0;
    int ret = EDL_EXIT_SUCCEEDED;
    if (rc == EDL_ENOTFOUND || (rc && rc != EDL_ECONFIG && rc != EDL_EPROTO)) {
        ret = report_etcd_error(&j, rc);
    } else {
        rc = cli_read_generation(j.c, &j.k, &v.gen);
        v.have_gen = rc == 0;
        if (rc && rc != EDL_ENOTFOUND && rc != EDL_EPROTO && rc != EDL_ECONFIG)
            ret = report_etcd_error(&j, rc);
        else if ((rc = read_pods(j.c, &j.k, &v)) != 0 ||
                 (rc = read_teachers(j.c, co.prefix, &v)) != 0)
            ret = report_etcd_error(&j, rc);
        else if (json)
            print_json(&v);
        else
            print_table(j.name, &v);
    }
    view_free(&v);
    job_close(&j);
    return ret;
}
