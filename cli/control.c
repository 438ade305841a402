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
    "\nExit codes: 0 done, 1 no such job (or its edl run is gone), 2 usage or invalid\n"         \
    "settings, 3 etcd unreachable or it refused our TLS certificate or credentials (the\n"     \
    "message names the endpoint), or for stop the stop not recorded within 60 s.\n"

int cli_etcd_option(edl_etcd_config *etcd, const char *flag, const char *value)
{
    char err[600];
    if (edl_etcd_config_set_option(etcd, flag, value, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "edl: %s\n", err);
    return -1;
}

/* The local job's etcd from its state file, refused when the launcher that wrote it is gone
 * (its etcd went with it). An exit code. */
static int local_etcd(edl_etcd_config *etcd, const char *job)
{
    char why[700];
    int rc = cli_state_read(job, etcd, why, sizeof why);
    if (rc) {
        fprintf(stderr, "edl: no etcd for job \"%s\": pass --etcd URL or set "
                        "EDL_ETCD_ENDPOINTS (%s)\n", job, why);
        return rc == EDL_ENOTFOUND ? EDL_EXIT_FAILED : EDL_EXIT_USAGE;
    }
    long pid;
    if (cli_state_launcher(job, &pid) == CLI_LAUNCHER_GONE) {
        fprintf(stderr, "edl: job \"%s\" has ended: the edl run that ran it here (pid %ld) is "
                        "gone, and its etcd with it (its state file is stale; the next edl run "
                        "of the job takes it over)\n", job, pid);
        return EDL_EXIT_FAILED;
    }
    return 0;
}

/* The only local job (edl service without --job): its name in out, or an exit code. */
static int only_local_job(char *out, size_t n)
{
    char names[8][EDL_NAME_MAX + 1];
    size_t count = 0;
    cli_state_jobs(names, 8, &count);
    if (count == 1) {
        snprintf(out, n, "%s", names[0]);
        fprintf(stderr, "edl: using the etcd of job \"%s\", the one edl run runs here\n", out);
        return 0;
    }
    if (count == 0)
        fprintf(stderr, "edl: no etcd: pass --etcd URL or set EDL_ETCD_ENDPOINTS (no job runs "
                        "under edl run on this machine)\n");
    else
        fprintf(stderr, "edl: no etcd: %zu jobs run under edl run on this machine (%s, %s%s): "
                        "choose one with --job NAME, or pass --etcd URL\n", count, names[0],
                names[1], count > 2 ? ", ..." : "");
    return EDL_EXIT_USAGE;
}

/* The settings: flags, else the environment, else the local job's state file (job NULL: the
 * only local job's); checked. co->local says whether the state file gave them. */
static int resolve_etcd(cli_common *co, const char *job)
{
    char err[600], only[EDL_NAME_MAX + 1];
    edl_etcd_config *etcd = &co->etcd;
    if (edl_etcd_config_from_env(etcd, err, sizeof err) != 0) {
        fprintf(stderr, "edl: %s\n", err);
        return EDL_EXIT_USAGE;
    }
    co->local = etcd->n_endpoints == 0;
    int rc = 0;
    if (co->local && !job && (rc = only_local_job(only, sizeof only)) == 0)
        job = only;
    if (!rc && co->local)
        rc = local_etcd(etcd, job);
    if (rc)
        return rc;
    if (edl_etcd_config_check(etcd, err, sizeof err) != 0) {
        char dir[512];
        cli_state_dir(dir, sizeof dir);
        if (co->local)
            fprintf(stderr, "edl: the state file of job \"%s\" (in %s) names a file that cannot "
                            "be used: %s\n", job, dir, err);
        else
            fprintf(stderr, "edl: %s\n", err);
        return EDL_EXIT_USAGE;
    }
    return 0;
}

int cli_connect(cli_common *co, const char *job, edl_etcd **out)
{
    int rc = resolve_etcd(co, job);
    if (!rc && edl_etcd_open(&co->etcd, out) != 0) {
        fprintf(stderr, "edl: invalid etcd settings%s%s%s\n", job ? " for job \"" : "",
                job ? job : "", job ? "\"" : "");
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
        if (!edl_prefix_valid(co->prefix))
            fprintf(stderr, "edl: --prefix '%s': " EDL_PREFIX_RULE "\n", co->prefix);
        else
            fprintf(stderr, "edl: job name \"%s\" is not valid: use 1-128 of [A-Za-z0-9._-], "
                            "not starting with '.' or '-'\n", name);
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

static void bad_count(const char *s, long hi)
{
    fprintf(stderr, "edl scale: the replica count must be a non-negative number (0..%ld), got "
                    "\"%s\"\n", hi, s);
}

/* A negative count ("edl scale JOB -5") reads as options to getopt: found before it runs. */
static bool negative_count(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (argv[i][0] == '-' && argv[i][1] >= '0' && argv[i][1] <= '9') {
            bad_count(argv[i], EDL_MEMBERS_MAX);
            return true;
        }
    return false;
}

/* The replica count of `edl scale JOB N`: 0, or -1 after saying why. */
static int scale_count(const char *job, const char *s, bool ps, long *n)
{
    char *end;
    long hi = ps ? EDL_PS_SERVERS_MAX : EDL_MEMBERS_MAX;
    *n = strtol(s, &end, 10);
    if (!*s || *end || *n < 0 || *n > hi) {
        bad_count(s, hi);
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
    int i = negative_count(argc, argv) ? -1 : parse_common(argc, argv, usage, &co, NULL, NULL,
                                                             &role);
    if (i < 0)
        return EDL_EXIT_USAGE;
    bool ps = strcmp(role, EDL_ROLE_PS) == 0, teacher = strcmp(role, EDL_ROLE_TEACHER) == 0;
    int r = teacher ? 2 : ps ? 1 : 0;
    int bad = argc - i != 2 || (!ps && !teacher && strcmp(role, EDL_ROLE_WORKER) != 0);
    if (bad && argc - i == 2)
        fprintf(stderr, "edl scale: unknown role %s (worker, ps or teacher)\n", role);
    else if (bad)
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

/* edl stop waits this long in all for the stop to be recorded; each etcd call within it is
 * bounded by STOP_CALL_MS, so that a gone etcd is noticed and the bound holds. */
#define STOP_WAIT_MS 60000
#define STOP_CALL_MS 3000

static bool launcher_gone(const job_ctx *j)
{
    long pid;
    return cli_state_launcher(j->name, &pid) != CLI_LAUNCHER_ALIVE;
}

/* Wait until deadline for the job server to record the stop; say what was seen: the final
 * state, the job's own etcd gone with its launcher (a local job), or what was still missing
 * when the time was up. An exit code. */
static int wait_stopped(const job_ctx *j, bool local, int64_t deadline)
{
    int rc = 0;
    edl_job_state seen = EDL_JOB_WAITING;
    while (edl_monotonic_ms() + STOP_CALL_MS <= deadline) {
        edl_generation g = {0};
        rc = cli_read_generation(j->c, &j->k, &g);
        seen = rc ? seen : g.state;
        if (!rc && edl_job_state_final(g.state))
            printf("job %s: %s (%s)\n", j->name, edl_job_state_name(g.state),
                   g.reason ? g.reason : "");
        edl_generation_clear(&g);
        if (!rc && edl_job_state_final(seen))
            return EDL_EXIT_SUCCEEDED;
        if (rc && rc != EDL_ENOTFOUND && local && launcher_gone(j)) {
            printf("job %s: the job's etcd is gone: the job has ended (edl run, which ran it "
                   "here, has exited)\n", j->name);
            return EDL_EXIT_SUCCEEDED;
        }
        usleep(100 * 1000);
    }
    if (rc && rc != EDL_ENOTFOUND)
        fprintf(stderr, "edl stop: timed out after %d s waiting for the job server to record "
                        "the stop: etcd does not answer (%s)\n", STOP_WAIT_MS / 1000,
                edl_etcd_errmsg(j->c));
    else
        fprintf(stderr, "edl stop: timed out after %d s waiting for the job server to record "
                        "the stop (the job is %s): is the job server running?\n",
                STOP_WAIT_MS / 1000, rc ? "without a generation" : edl_job_state_name(seen));
    return EDL_EXIT_UNREACHABLE;
}

int cli_stop(int argc, char **argv)
{
    static const char usage[] =
        "Usage: edl stop JOB [--no-wait] [--etcd URLS] [--prefix PREFIX]\n"
        "Asks the job to stop: trainers are stopped, agents leave, and the job ends as\n"
        "\"stopped\". Then waits, 60 s at most in all, until the job server has recorded it\n"
        "(unless --no-wait), or until the job's own etcd is gone with the edl run that ran it\n"
        "here (the job has ended: exit 0); after 60 s it says what it was waiting for (exit 3).\n";
    int64_t deadline = edl_monotonic_ms() + STOP_WAIT_MS;
    cli_common co = {0};
    bool wait = true;
    int i = parse_common(argc, argv, usage, &co, NULL, &wait, NULL);
    if (i < 0)
        return EDL_EXIT_USAGE;
    if (argc - i != 1) {
        fprintf(stderr, "%s", usage);
        edl_etcd_config_clear(&co.etcd);
        return EDL_EXIT_USAGE;
    }
    co.etcd.timeout_ms = STOP_CALL_MS;
    job_ctx j;
    int rc = job_open(&co, argv[i], &j);
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
        fflush(stdout);
        if (wait)
            ret = wait_stopped(&j, co.local, deadline);
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

/* The pod's exclusion in force (excluded_until in the future), or NULL. */
static const edl_pod_failures *exclusion_of(const job_view *v, const char *pod)
{
    for (size_t i = 0; v->have_gen && i < v->gen.n_failures; i++)
        if (strcmp(v->gen.failures[i].pod, pod) == 0 &&
            v->gen.failures[i].excluded_until > (int64_t)time(NULL) * 1000)
            return &v->gen.failures[i];
    return NULL;
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
    return exclusion_of(v, p->name) ? "excluded" : "-";
}

/* Where a pod's row goes: workers by rank, then servers by rank, standbys in their order,
 * excluded pods, the rest; by name within a class. */
typedef struct row_key {
    int cls;
    long key;
    const char *name;
    size_t i;
} row_key;

static int row_cmp(const void *a, const void *b)
{
    const row_key *x = a, *y = b;
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return strcmp(x->name, y->name);
}

static void row_of(const job_view *v, size_t i, row_key *r)
{
    const edl_pod *p = &v->pods[i];
    const edl_member *m = v->have_gen ? edl_generation_member(&v->gen, p->name, p->lease) : NULL;
    const edl_member *s = v->have_gen ? edl_generation_server(&v->gen, p->name, p->lease) : NULL;
    *r = (row_key){.cls = 4, .name = p->name, .i = i};
    if (m || s) {
        r->cls = m ? 0 : 1;
        r->key = m ? m->rank : s->rank;
        return;
    }
    for (size_t k = 0; v->have_gen && k < v->gen.n_standbys; k++)
        if (strcmp(v->gen.standbys[k], p->name) == 0) {
            r->cls = 2;
            r->key = (long)k;
            return;
        }
    if (exclusion_of(v, p->name))
        r->cls = 3;
}

static void print_row(const job_view *v, size_t i)
{
    const edl_pod *p = &v->pods[i];
    char rk[16], ep[300], state[32] = "-", gen[24] = "-", step[24] = "-", starts[24] = "-";
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
        snprintf(starts, sizeof starts, "%lld", (long long)s->restarts + 1);
    }
    printf("%-6s %-24s %-22s %-9s %-6s %-8s %-8s %s\n", role_of(v, p, rk, sizeof rk), p->name, ep,
           state, gen, step, starts, metrics);
}

/* The pods in row order, then what their trainers said and when their exclusions end. */
static void print_pods(const job_view *v)
{
    row_key *rows = calloc(v->n_pods + 1, sizeof *rows);
    if (!rows)
        return;
    for (size_t i = 0; i < v->n_pods; i++)
        row_of(v, i, &rows[i]);
    qsort(rows, v->n_pods, sizeof *rows, row_cmp);
    printf("%-6s %-24s %-22s %-9s %-6s %-8s %-8s %s\n", "RANK", "POD", "ENDPOINT", "TRAINER",
           "GEN", "STEP", "STARTS", "METRICS");
    for (size_t r = 0; r < v->n_pods; r++)
        print_row(v, rows[r].i);
    for (size_t r = 0; r < v->n_pods; r++) { /* their error, why they hung */
        size_t i = rows[r].i;
        if (v->has_st[i] && v->st[i].message[0])
            printf("%s: %s\n", v->pods[i].name, v->st[i].message);
    }
    for (size_t r = 0; r < v->n_pods; r++) {
        const edl_pod_failures *f = exclusion_of(v, v->pods[rows[r].i].name);
        if (!f)
            continue;
        char when[16];
        time_t t = (time_t)(f->excluded_until / 1000);
        strftime(when, sizeof when, "%H:%M:%S", localtime(&t));
        printf("%s: excluded until %s (in %lld s) after %d failures\n", f->pod, when,
               (long long)((f->excluded_until - (int64_t)time(NULL) * 1000 + 999) / 1000),
               f->count);
    }
    free(rows);
}

/* A member's failure in the running generation that the job server has not acted on yet
 * (it holds the decision while a peer may be silent: docs/elastic.md, "How failures are
 * judged"), so a pause after a failure is not a mystery. */
static void print_pending_failures(const job_view *v)
{
    if (!v->have_gen || v->gen.state != EDL_JOB_RUNNING)
        return;
    int64_t ttl = v->have_spec ? v->spec.ttl_s : 0; /* the longest a peer's lease may run */
    for (size_t i = 0; i < v->n_pods; i++)
        ttl = v->pods[i].ttl_s > ttl ? v->pods[i].ttl_s : ttl;
    for (size_t i = 0; i < v->n_pods; i++) {
        const edl_pod_status *s = v->has_st[i] ? &v->st[i] : NULL;
        const edl_member *m = edl_generation_member(&v->gen, v->pods[i].name, v->pods[i].lease);
        char what[48];
        if (!m || !s || s->generation != v->gen.generation ||
            !edl_trainer_failure(s, what, sizeof what))
            continue;
        printf("pending: pod %s (rank %d) %s in generation %lld; the job server decides once its "
               "peers step, fail, renew their leases or lose them (at most %lld s after it)\n",
               v->pods[i].name, m->rank, what, (long long)v->gen.generation,
               (long long)(ttl + EDL_HOLD_MARGIN_MS / 1000));
    }
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
        printf("%d restarts after trainer failures\n", v->gen.restarts);
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
    print_pods(v);
    print_pending_failures(v);
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

/* The spec, generation, pods and teachers of the job: EDL_EXIT_SUCCEEDED, or the exit code of
 * an etcd error already reported. */
static int read_view(job_ctx *j, const cli_common *co, job_view *v)
{
    edl_spec_init(&v->spec);
    int rc = cli_read_spec(j->c, &j->k, &v->spec, NULL);
    v->have_spec = rc == 0;
    if (rc == EDL_ENOTFOUND || (rc && rc != EDL_ECONFIG && rc != EDL_EPROTO))
        return report_etcd_error(j, rc);
    rc = cli_read_generation(j->c, &j->k, &v->gen);
    v->have_gen = rc == 0;
    if (rc && rc != EDL_ENOTFOUND && rc != EDL_EPROTO && rc != EDL_ECONFIG)
        return report_etcd_error(j, rc);
    if ((rc = read_pods(j->c, &j->k, v)) != 0 || (rc = read_teachers(j->c, co->prefix, v)) != 0)
        return report_etcd_error(j, rc);
    return EDL_EXIT_SUCCEEDED;
}

/* ---- status --watch ---------------------------------------------------------------------- */

/* What the watch remembers between reads: each pod's step and when it last moved, the
 * generations it saw and when their world first stepped, the newest checkpoint's step. */
#define WATCH_PODS 256
#define WATCH_GENS 5
#define STALL_MS 10000 /* a running rank without a step this long is marked */

typedef struct pod_seen {
    char name[EDL_NAME_MAX + 1];
    int64_t step, moved_ms; /* moved_ms: when its step last changed (0: never seen moving) */
    double rate;            /* steps per second over the last interval */
} pod_seen;

typedef struct gen_seen {
    int64_t gen, published_ms, formed_ms; /* formed_ms: its first step seen (0: not yet; -1:
                                           * formed before the watch began) */
    char reason[160];
} gen_seen;

typedef struct watch_state {
    pod_seen pods[WATCH_PODS];
    size_t n_pods;
    gen_seen gens[WATCH_GENS]; /* newest first */
    size_t n_gens;
    int64_t ckpt_step, ckpt_seen_ms; /* -1: none */
    int64_t last_ms;
} watch_state;

/* -w/--watch and --interval SECONDS, taken out of argv for the common options' parser. */
static int take_watch_args(int *argc, char **argv, int64_t *interval_ms)
{
    bool watch = false;
    double secs = 1;
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            while (i < *argc)
                argv[out++] = argv[i++];
            break;
        }
        if (strcmp(argv[i], "-w") == 0 || strcmp(argv[i], "--watch") == 0) {
            watch = true;
        } else if (strcmp(argv[i], "--interval") == 0) {
            char *end = NULL;
            secs = i + 1 < *argc ? strtod(argv[++i], &end) : 0;
            if (!end || *end || !(secs >= 0.05 && secs <= 3600)) {
                fprintf(stderr, "edl status: --interval %s: expected seconds, 0.05 to 3600\n",
                        i < *argc ? argv[i] : "(missing)");
                return EDL_EXIT_USAGE;
            }
        } else {
            argv[out++] = argv[i];
        }
    }
    argv[out] = NULL;
    *argc = out;
    *interval_ms = watch ? (int64_t)(secs * 1000) : 0;
    return 0;
}

static pod_seen *pod_seen_of(watch_state *w, const char *name)
{
    for (size_t i = 0; i < w->n_pods; i++)
        if (strcmp(w->pods[i].name, name) == 0)
            return &w->pods[i];
    if (w->n_pods == WATCH_PODS)
        return NULL;
    pod_seen *p = &w->pods[w->n_pods++];
    *p = (pod_seen){.step = -1};
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

/* Fold one read into the memory: step rates, stalls, generations and their formation. */
static void watch_update(watch_state *w, const job_view *v, int64_t now)
{
    double dt = w->last_ms ? (double)(now - w->last_ms) / 1000.0 : 0;
    bool stepped_in_gen = false;
    for (size_t i = 0; i < v->n_pods; i++) {
        pod_seen *p = pod_seen_of(w, v->pods[i].name);
        if (!p || !v->has_st[i])
            continue;
        int64_t step = v->st[i].step;
        p->rate = dt > 0 && p->step >= 0 && step > p->step ? (double)(step - p->step) / dt : 0;
        if (step != p->step && step >= 0) {
            p->moved_ms = now;
            if (w->n_gens && v->st[i].generation >= w->gens[0].gen && p->step >= 0)
                stepped_in_gen = true;
        }
        p->step = step;
    }
    if (v->have_gen && (!w->n_gens || w->gens[0].gen != v->gen.generation)) {
        memmove(&w->gens[1], &w->gens[0], sizeof w->gens[0] * (WATCH_GENS - 1));
        w->n_gens += w->n_gens < WATCH_GENS;
        /* a world already there at the first read formed before we looked: time unknown */
        w->gens[0] = (gen_seen){.gen = v->gen.generation, .published_ms = v->gen.published_ms,
                                .formed_ms = w->last_ms ? 0 : -1};
        snprintf(w->gens[0].reason, sizeof w->gens[0].reason, "%s",
                 v->gen.reason ? v->gen.reason : "");
    } else if (w->n_gens && !w->gens[0].formed_ms && stepped_in_gen) {
        w->gens[0].formed_ms = edl_wall_ms();
    }
    w->last_ms = now;
}

/* The newest checkpoint's step from the job's pointer (-1: none or unreadable). */
static int64_t newest_checkpoint(job_ctx *j)
{
    edl_kv *kv = NULL;
    int64_t rev, step = -1;
    if (edl_etcd_get(j->c, edl_str(j->k.checkpoint), &kv, &rev) != 0 || !kv)
        return -1;
    cJSON *o = cJSON_ParseWithLength(kv->value, kv->value_len);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
    if (cJSON_IsNumber(s))
        step = (int64_t)s->valuedouble;
    cJSON_Delete(o);
    edl_kv_free(kv);
    return step;
}

static void print_watch_pods(const watch_state *w, const job_view *v, int64_t now)
{
    printf("%-6s %-24s %-9s %-5s %-9s %-8s %s\n", "RANK", "POD", "TRAINER", "GEN", "STEP",
           "STEP/S", "LAST STEP");
    row_key *rows = calloc(v->n_pods + 1, sizeof *rows);
    for (size_t i = 0; rows && i < v->n_pods; i++)
        row_of(v, i, &rows[i]);
    if (rows)
        qsort(rows, v->n_pods, sizeof *rows, row_cmp);
    for (size_t r = 0; rows && r < v->n_pods; r++) {
        size_t i = rows[r].i;
        const pod_seen *p = NULL;
        for (size_t k = 0; k < w->n_pods; k++)
            if (strcmp(w->pods[k].name, v->pods[i].name) == 0)
                p = &w->pods[k];
        char rk[16], gen[24] = "-", step[24] = "-", last[48] = "-";
        const edl_pod_status *s = v->has_st[i] ? &v->st[i] : NULL;
        if (s)
            snprintf(gen, sizeof gen, "%lld", (long long)s->generation);
        if (s && s->step >= 0)
            snprintf(step, sizeof step, "%lld", (long long)s->step);
        bool running = s && s->state == EDL_TRAINER_RUNNING;
        if (p && p->moved_ms)
            snprintf(last, sizeof last, "%.1f s ago%s", (double)(now - p->moved_ms) / 1000.0,
                     running && now - p->moved_ms > STALL_MS ? "  STALLED" : "");
        printf("%-6s %-24s %-9s %-5s %-9s %-8.1f %s\n", role_of(v, &v->pods[i], rk, sizeof rk),
               v->pods[i].name, s ? edl_trainer_state_name(s->state) : "-", gen, step,
               p ? p->rate : 0.0, last);
    }
    free(rows);
}

static void print_watch_gens(const watch_state *w)
{
    printf("generations (newest first):\n");
    for (size_t i = 0; i < w->n_gens; i++) {
        const gen_seen *g = &w->gens[i];
        char formed[48] = "forming";
        if (g->formed_ms > 0 && g->published_ms)
            snprintf(formed, sizeof formed, "formed in %.1f s",
                     (double)(g->formed_ms - g->published_ms) / 1000.0);
        else if (i > 0 || !g->published_ms || g->formed_ms < 0)
            snprintf(formed, sizeof formed, "-");
        printf("  %-5lld %-18s %s\n", (long long)g->gen, formed, g->reason);
    }
}

/* The time to the end, where a running trainer of the current generation said its total
 * ("total" progress line): the furthest such rank's step, and the fastest rate the watch
 * measured among them (data-parallel ranks step together). */
static void print_watch_eta(const watch_state *w, const job_view *v)
{
    int64_t total = 0, step = -1;
    double rate = 0;
    for (size_t i = 0; v->have_gen && i < v->n_pods; i++) {
        const edl_pod_status *s = v->has_st[i] ? &v->st[i] : NULL;
        if (!s || s->total_steps <= 0 || s->state != EDL_TRAINER_RUNNING ||
            s->generation != v->gen.generation)
            continue;
        total = s->total_steps > total ? s->total_steps : total;
        step = s->step > step ? s->step : step;
        for (size_t k = 0; k < w->n_pods; k++)
            if (strcmp(w->pods[k].name, v->pods[i].name) == 0 && w->pods[k].rate > rate)
                rate = w->pods[k].rate;
    }
    if (total <= 0)
        return;
    if (step < 0 || rate <= 0) {
        printf("time to the end: step %lld of %lld, no estimate (no step since the last "
               "read)\n", (long long)(step < 0 ? 0 : step), (long long)total);
        return;
    }
    long long secs = step >= total ? 0 : (long long)((double)(total - step) / rate + 0.5);
    char left[48];
    if (secs >= 3600)
        snprintf(left, sizeof left, "%lldh %02lldm", secs / 3600, secs / 60 % 60);
    else
        snprintf(left, sizeof left, "%lldm %02llds", secs / 60, secs % 60);
    printf("time to the end: step %lld of %lld, about %s at %.1f steps/s\n", (long long)step,
           (long long)total, left, rate);
}

/* One screen: the job's line, the ranks, the generations, the checkpoint. */
static void print_watch(const char *job, const watch_state *w, const job_view *v, int64_t now)
{
    if (!v->have_gen)
        printf("job %s: no generation yet (%zu pods registered)\n", job, v->n_pods);
    else
        printf("job %s: %s, generation %lld, world size %zu, %d restarts\n", job,
               edl_job_state_name(v->gen.state), (long long)v->gen.generation,
               v->gen.n_members, v->gen.restarts);
    print_watch_pods(w, v, now);
    print_pending_failures(v);
    print_watch_eta(w, v);
    print_watch_gens(w);
    if (w->ckpt_step >= 0)
        printf("newest checkpoint: step %lld, seen %.0f s ago\n", (long long)w->ckpt_step,
               (double)(now - w->ckpt_seen_ms) / 1000.0);
    else
        printf("newest checkpoint: none\n");
}

static bool job_over(const job_view *v)
{
    return v->have_gen && (v->gen.state == EDL_JOB_SUCCEEDED ||
                           v->gen.state == EDL_JOB_FAILED || v->gen.state == EDL_JOB_STOPPED);
}

/* Read, fold, show, sleep, until the job ends (or a read fails). On a terminal the screen is
 * cleared and drawn again from its top; otherwise each block follows a "--- TIME" line. */
static int watch_job(job_ctx *j, const cli_common *co, int64_t interval_ms)
{
    static watch_state w; /* large: off the stack */
    w = (watch_state){.ckpt_step = -1};
    bool tty = isatty(STDOUT_FILENO);
    for (;;) {
        job_view v = {0};
        int ret = read_view(j, co, &v);
        int64_t now = edl_monotonic_ms();
        if (ret == EDL_EXIT_SUCCEEDED) {
            watch_update(&w, &v, now);
            int64_t ck = newest_checkpoint(j);
            if (ck != w.ckpt_step)
                w.ckpt_step = ck, w.ckpt_seen_ms = now;
            char when[16];
            time_t t = time(NULL);
            strftime(when, sizeof when, "%H:%M:%S", localtime(&t));
            if (tty)
                printf("\033[H\033[2J%s  edl status %s --watch (Ctrl-C quits)\n", when, j->name);
            else
                printf("--- %s\n", when);
            print_watch(j->name, &w, &v, now);
            fflush(stdout);
        }
        bool over = job_over(&v);
        view_free(&v);
        if (ret != EDL_EXIT_SUCCEEDED || over)
            return ret;
        usleep((useconds_t)(interval_ms * 1000));
    }
}

int cli_status(int argc, char **argv)
{
    static const char usage[] =
        "Usage: edl status JOB [--json | -w, --watch [--interval SECONDS]] [--etcd URLS]\n"
        "                  [--prefix PREFIX]\n"
        "Shows the job's state, generation, members, its restarts after trainer failures, and\n"
        "a row per pod in rank order (workers, parameter servers as \"ps N\", standbys, excluded\n"
        "pods): its trainer, the generation and step it reported and STARTS, how often its agent\n"
        "started a trainer (every generation starts one, not only failures); then what trainers\n"
        "said, when each exclusion ends, and the teachers registered in the service of the job's\n"
        "teachers (instance, endpoint, load); --json: the spec, generation (with \"servers\"),\n"
        "pods (with their role) and teachers as one JSON object.\n"
        "-w, --watch: read again every --interval seconds (1) until the job ends: each rank's\n"
        "step, steps per second and time since its last step, the time to the end where the\n"
        "trainers said their total steps, the last generations with their reasons and\n"
        "re-formation times, the newest checkpoint; one screen refreshed in place on a\n"
        "terminal, the same block after a \"--- TIME\" line otherwise.\n";
    cli_common co = {0};
    bool json = false;
    int64_t interval_ms = 0;
    int rc = take_watch_args(&argc, argv, &interval_ms);
    if (rc)
        return rc;
    job_ctx j;
    rc = open_job(argc, argv, usage, &co, &json, NULL, &j);
    if (rc)
        return rc;
    if (interval_ms > 0 && json) {
        fprintf(stderr, "edl status: --watch and --json do not go together; use one\n");
        job_close(&j);
        return EDL_EXIT_USAGE;
    }
    if (interval_ms > 0) {
        rc = watch_job(&j, &co, interval_ms);
        job_close(&j);
        return rc;
    }
    job_view v = {0};
    int ret = read_view(&j, &co, &v);
    if (ret == EDL_EXIT_SUCCEEDED && json)
        print_json(&v);
    else if (ret == EDL_EXIT_SUCCEEDED)
        print_table(j.name, &v);
    view_free(&v);
    job_close(&j);
    return ret;
}
