/* run.c: `edl run`, a whole elastic job on one machine.
 *
 * It starts an etcd of its own (unless given one), writes the job's spec, starts a job server
 * and as many agents as the spec's replicas ask for, streams their output with a prefix that
 * names each pod's rank (and keeps it by pod and rank for `edl logs`, logs.c), and exits with
 * the job's result. Here the launcher plays the part the Kubernetes operator plays
 * in a cluster, and only that part: it watches `replicas` (and, with the ps role, `ps.replicas`)
 * in the spec and starts or stops agent processes of each role to match (a crashed agent's
 * lease is revoked the moment it is reaped, and it is replaced by a new pod, as a ReplicaSet
 * would make), while membership, ranks and restarts stay
 * the job server's and the agents' business. Parameter servers run the same trainer command
 * under `edl-agent --role ps` (Paddle style: the program reads TRAINING_ROLE), and so do the
 * teachers of a distillation job (`--teachers`: `edl-agent --role teacher`, the program reads
 * EDL_ROLE_NAME), each on a free port of its own, kept at teachers.replicas. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "edl/checkpoint.h"
#include "edl/etcd_server.h"
#include "edl/log.h"
#include "edl/loop.h"
#include "edl/net.h"
#include "edl/proc.h"
#include "edl/secret.h"

#define MAX_KIDS CLI_LOCAL_AGENTS_MAX
enum { ROLE_W, ROLE_PS, ROLE_T, N_ROLES };
#define LINE_MAX_BYTES 4096

typedef struct child {
    pid_t pid;
    char name[EDL_NAME_MAX + 16];
    int out;                  /* read end of the child's stdout+stderr, -1 once closed */
    char buf[LINE_MAX_BYTES];
    size_t len;
    bool stopping;            /* we sent SIGTERM */
    int64_t kill_at;          /* SIGKILL if still alive then (0: not scheduled) */
    bool exited;
    int status;               /* exit code or 128+signal */
    int role;                 /* ROLE_W, ROLE_PS (pods <job>-ps-N), ROLE_T (<job>-teacher-N) */
    const char *kind;         /* what the pod is in the newest generation seen: "rank" (a
                               * member), "server", or NULL (no rank) ... */
    int num;                  /* ... and its rank or server index */
    int log_fd;               /* its file in the job's logs for log_kind/log_num (-1: none) */
    const char *log_kind;
    int log_num;
} child;

typedef struct run_opts {
    edl_job_spec spec;
    const char *job;
    edl_etcd_config etcd;     /* --etcd and its TLS/auth flags: an etcd of the user's */
    bool insecure;            /* our own etcd on plain http */
    bool fresh;               /* --fresh: move the checkpoints aside, start over */
    const char *prefix;
    int64_t grace_ms;
    char **trainer;           /* argv after "--", or the manifest's command */
    const char *file;         /* -f: a TrainingJob manifest (NULL: none) */
    cli_manifest m;           /* ... read from it */
    int64_t deadline_s;       /* the manifest's activeDeadlineSeconds (-1: none) */
} run_opts;

typedef struct launcher {
    run_opts o;
    edl_etcd_server *srv;
    char tls_dir[PATH_MAX];   /* our own etcd's throwaway certificates ("" for none) */
    edl_etcd_config cfg;      /* how everyone reaches the job's etcd */
    char **child_env;         /* the environment of the job server and agents: cfg as EDL_ETCD_* */
    edl_etcd *c;
    char agent_bin[PATH_MAX], js_bin[PATH_MAX];
    child js;
    child *kids[MAX_KIDS];
    size_t n_kids;
    int next_index[N_ROLES];  /* each role's next pod number */
    edl_loop *loop;           /* the one loop: signals, the children's output, the watch */
    edl_watch *w;             /* the job's keys; only spec and generation matter here */
    edl_job_keys k;
    int desired[N_ROLES];     /* agents of each role that replicas, ps.replicas and
                               * teachers.replicas ask for */
    int64_t gen;
    bool final;
    edl_job_state state;
    char failed_why[600];     /* a failed job's reason, for the last line ("": none) */
    int interrupted;          /* 0, or the signal that asked us to stop */
    int64_t started_ms;
    char secret[PATH_MAX];    /* the job secret made for this run ("": none made) */
    char scratch[PATH_MAX];   /* the agents' own directories go here ("": none made) */
    char log_dir[PATH_MAX];   /* each child's output by pod and rank (logs.c; "": none) */
    int lock_fd;              /* holds <state dir>/<job>.lock (-1: not taken) */
    bool ran;                 /* the job was put into etcd: a summary line ends the output */
    bool deadline_passed;     /* activeDeadlineSeconds passed: the job is stopped as failed */
    bool deadline_stopped;    /* ... and the stop is in the spec */
    int64_t deadline_retry_ms; /* when to write the stop again after a failed write (0: none) */
    int64_t poll_due_ms;      /* without a watch: when to read the job again (0: a watch) */
    char teacher_capacity[16]; /* -f: spec.teachers.capacity as the teachers' --capacity */
} launcher;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("edl | ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    fflush(stdout);
    va_end(ap);
}

/* ---- binaries and children ---------------------------------------------------------------- */

/* $ENV, else next to this program, else the name (edl_spawn looks it up in PATH). */
static void find_bin(const char *env, const char *name, char *out, size_t n)
{
    const char *e = getenv(env);
    if (e && *e) {
        snprintf(out, n, "%s", e);
        return;
    }
    char self[PATH_MAX - 64];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0) {
        self[len] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(out, n, "%s/%s", self, name);
            if (access(out, X_OK) == 0)
                return;
        }
    }
    snprintf(out, n, "%s", name);
}

static void pump(launcher *l, child *k, bool eof);

static void on_output(edl_loop *lp, int fd, int events, void *arg);

/* The loop pumps k's output while its pipe is open (pump closes it and says so). */
static int watch_output(launcher *l, child *k)
{
    return edl_loop_fd_add(l->loop, k->out, EDL_LOOP_READ, on_output, l);
}

static void close_output(launcher *l, child *k)
{
    edl_loop_fd_del(l->loop, k->out);
    close(k->out);
    k->out = -1;
}

/* Start a child whose stdout and stderr come back through a pipe (k->out), in a process group
 * of its own (the terminal's Ctrl-C reaches the launcher only; it stops them), dying with the
 * launcher. */
static int spawn(launcher *l, child *k, char **argv)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return EDL_EIO;
    edl_spawn_opts so = {.argv = argv, .envp = l->child_env, .out = p[1], .err = p[1],
                         .new_group = true};
    char err[512];
    pid_t pid;
    int rc = edl_spawn(&so, &pid, err, sizeof err);
    close(p[1]);
    if (rc) {
        say("%s", err);
        close(p[0]);
        return rc;
    }
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    k->pid = pid;
    k->out = p[0];
    return watch_output(l, k);
}

/* Append a line to the child's file for what the pod is now (opened again when that changed;
 * the first failure to write ends the files of this run, with a warning). */
static void log_line(launcher *l, child *k, const char *text, size_t len)
{
    if (!l->log_dir[0])
        return;
    if (k->log_fd >= 0 && (k->log_kind != k->kind || k->log_num != k->num)) {
        close(k->log_fd);
        k->log_fd = -1;
    }
    char path[PATH_MAX + 2 * EDL_NAME_MAX];
    cli_logs_path(l->log_dir, k->name, k->kind, k->num, path, sizeof path);
    if (k->log_fd < 0) {
        k->log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
        k->log_kind = k->kind;
        k->log_num = k->num;
    }
    struct iovec iov[2] = {{(void *)text, len}, {"\n", 1}};
    if (k->log_fd < 0 || writev(k->log_fd, iov, 2) != (ssize_t)len + 1) {
        say("warning: cannot write %s (%s): no more log files for edl logs in this run", path,
            strerror(errno));
        l->log_dir[0] = '\0';
    }
}

/* One line of a child: on our output behind what the pod is in the newest generation seen
 * ("[rank 0 edl-job-1] ...", "[edl-job-3] ..." without a rank), and in its log file. */
static void emit(launcher *l, child *k, const char *text, int len)
{
    if (k->kind)
        printf("[%s %d %s] %.*s\n", k->kind, k->num, k->name, len, text);
    else
        printf("[%s] %.*s\n", k->name, len, text);
    log_line(l, k, text, (size_t)len);
}

static void close_log(child *k)
{
    if (k->log_fd >= 0)
        close(k->log_fd);
    k->log_fd = -1;
}

/* Print complete lines with the child's rank and name in front; flush a partial one at
 * `eof`. */
static void pump(launcher *l, child *k, bool eof)
{
    for (;;) {
        if (k->out >= 0 && k->len < sizeof k->buf) {
            ssize_t n = read(k->out, k->buf + k->len, sizeof k->buf - k->len);
            if (n > 0)
                k->len += (size_t)n;
            else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                close_output(l, k);
                eof = true;
            }
        }
        char *nl;
        size_t start = 0;
        while ((nl = memchr(k->buf + start, '\n', k->len - start))) {
            emit(l, k, k->buf + start, (int)(nl - (k->buf + start)));
            start = (size_t)(nl - k->buf) + 1;
        }
        if (start == 0 && (k->len == sizeof k->buf || (eof && k->len))) {
            emit(l, k, k->buf, (int)k->len);
            start = k->len;
        }
        memmove(k->buf, k->buf + start, k->len - start);
        k->len -= start;
        fflush(stdout);
        if (k->out < 0 || k->len == sizeof k->buf || start == 0)
            break;
    }
}

/* Where the agents and the job server of a local job serve /metrics (loopback: one machine). */
#define LOCAL_METRICS_ADDR "127.0.0.1"

/* The role's options: --role ps, or --role teacher --service S --port P (a free port), with
 * -f also the manifest's --model M and --capacity N. */
static size_t role_args(launcher *l, int role, char **argv, char *port, size_t n)
{
    size_t a = 0;
    if (role == ROLE_PS) {
        argv[a++] = "--role";
        argv[a++] = EDL_ROLE_PS;
    } else if (role == ROLE_T) {
        snprintf(port, n, "%d", edl_free_port("127.0.0.1"));
        argv[a++] = "--role";
        argv[a++] = EDL_ROLE_TEACHER;
        argv[a++] = "--service";
        argv[a++] = l->o.spec.teachers_service;
        if (l->o.file && l->o.m.tj.teacher_model) { /* -f: spec.teachers.model, capacity */
            argv[a++] = "--model";
            argv[a++] = l->o.m.tj.teacher_model;
        }
        if (l->o.file && l->o.m.tj.teacher_capacity > 0) {
            snprintf(l->teacher_capacity, sizeof l->teacher_capacity, "%d",
                     l->o.m.tj.teacher_capacity);
            argv[a++] = "--capacity";
            argv[a++] = l->teacher_capacity;
        }
        if (strcmp(port, "0") != 0) {
            argv[a++] = "--port";
            argv[a++] = port;
        }
    }
    return a;
}

/* An agent of any role (ps: `--role ps`, pod <job>-ps-N; teacher: `--role teacher`, pod
 * <job>-teacher-N; names are never reused). */
static int start_agent(launcher *l, int role)
{
    if (l->n_kids >= MAX_KIDS)
        return EDL_ETOOBIG;
    child *k = calloc(1, sizeof *k);
    if (!k)
        return EDL_ENOMEM;
    k->role = role;
    k->log_fd = -1;
    static const char *const suffix[N_ROLES] = {"", "-ps", "-teacher"};
    snprintf(k->name, sizeof k->name, "%s%s-%d", l->o.job, suffix[role],
             l->next_index[role]++);
    char grace[32], tport[16];
    snprintf(grace, sizeof grace, "%lld", (long long)l->o.grace_ms);
    char *argv[64 + 1024];
    size_t a = 0;
    argv[a++] = l->agent_bin;
    argv[a++] = "--job";
    argv[a++] = (char *)l->o.job;
    argv[a++] = "--pod";
    argv[a++] = k->name;
    argv[a++] = "--prefix";
    argv[a++] = (char *)l->o.prefix;
    argv[a++] = "--grace-ms";
    argv[a++] = grace;
    if (l->scratch[0]) {
        argv[a++] = "--scratch-dir";
        argv[a++] = l->scratch;
    }
    a += role_args(l, role, argv + a, tport, sizeof tport);
    /* edl status shows where each agent's /metrics is, from its registration: a port chosen
     * here would be free only until the agent binds it (another process may take it first) */
    argv[a++] = "--metrics-port";
    argv[a++] = "auto";
    argv[a++] = "--metrics-addr";
    argv[a++] = LOCAL_METRICS_ADDR;
    argv[a++] = "--";
    for (char **t = l->o.trainer; *t && a < sizeof argv / sizeof argv[0] - 1; t++)
        argv[a++] = *t;
    argv[a] = NULL;
    int rc = spawn(l, k, argv);
    if (rc) {
        free(k);
        return rc;
    }
    l->kids[l->n_kids++] = k;
    return 0;
}

static int start_jobserver(launcher *l)
{
    snprintf(l->js.name, sizeof l->js.name, "jobserver");
    char id[EDL_NAME_MAX + 32];
    snprintf(id, sizeof id, "%s-jobserver-%d", l->o.job, (int)getpid());
    /* it binds a free port itself and names it in its first lines ("/metrics at URL") */
    char *argv[] = {l->js_bin, "--job", (char *)l->o.job, "--prefix", (char *)l->o.prefix,
                    "--id", id, "--ttl", "5", "--metrics-port", "auto", "--metrics-addr",
                    LOCAL_METRICS_ADDR, NULL};
    return spawn(l, &l->js, argv);
}

static void stop_child(child *k, int64_t grace_ms)
{
    if (k->exited || k->stopping)
        return;
    kill(k->pid, SIGTERM);
    k->stopping = true;
    k->kill_at = edl_monotonic_ms() + grace_ms;
}

/* Agents still running (of every role), stopping ones included or not. */
static size_t agents_alive(const launcher *l, bool count_stopping)
{
    size_t n = 0;
    for (size_t i = 0; i < l->n_kids; i++)
        if (!l->kids[i]->exited && (count_stopping || !l->kids[i]->stopping))
            n++;
    return n;
}

/* Agents of one role that run and are not being stopped. */
static size_t role_alive(const launcher *l, int role)
{
    size_t n = 0;
    for (size_t i = 0; i < l->n_kids; i++)
        if (!l->kids[i]->exited && !l->kids[i]->stopping && l->kids[i]->role == role)
            n++;
    return n;
}

/* ---- the job in etcd ---------------------------------------------------------------------- */

/* Every key of the job but its checkpoint pointer: a job run again resumes from its
 * checkpoints (found from the store when the pointer is gone too, edl/checkpoint.h). */
static int delete_job_keys(launcher *l)
{
    char *end = NULL, *after = NULL;
    size_t end_len = 0, plen = strlen(l->k.checkpoint);
    int rc = edl_etcd_prefix_end(edl_str(l->k.job), &end, &end_len);
    edl_txn *t = rc ? NULL : edl_txn_new();
    if (t && (after = calloc(1, plen + 1))) {
        memcpy(after, l->k.checkpoint, plen); /* the key after the pointer: pointer + "\0" */
        edl_delete_opts before = {.range_end = edl_str(l->k.checkpoint)};
        edl_delete_opts rest = {.range_end = edl_bytes(end, end_len)};
        edl_txn_delete(t, EDL_TXN_SUCCESS, edl_str(l->k.job), &before);
        edl_txn_delete(t, EDL_TXN_SUCCESS, edl_bytes(after, plen + 1), &rest);
        edl_txn_result r = {0};
        rc = edl_etcd_txn(l->c, t, &r);
        edl_txn_result_clear(&r);
    } else if (!rc) {
        rc = EDL_ENOMEM;
    }
    edl_txn_free(t);
    free(after);
    free(end);
    return rc;
}

/* --fresh: the job starts over on purpose; its checkpoints move aside (edl_ckpt_set_aside). */
static int set_checkpoints_aside(launcher *l)
{
    if (!l->o.spec.checkpoint_uri) {
        say("--fresh: the job has no --checkpoint-uri: nothing to move aside");
        return 0;
    }
    edl_ckpt_config cfg;
    edl_ckpt_config_init(&cfg);
    cfg.uri = l->o.spec.checkpoint_uri;
    cfg.etcd = l->c;
    cfg.prefix = l->o.prefix;
    cfg.job = l->o.job;
    char where[PATH_MAX + 64], err[1024];
    size_t moved = 0;
    int rc = edl_ckpt_set_aside(&cfg, where, sizeof where, &moved, err, sizeof err);
    if (rc)
        fprintf(stderr, "edl run: --fresh: %s\n", err);
    else if (moved)
        say("--fresh: moved %zu checkpoint%s of %s to %s; the job starts without them", moved,
            moved == 1 ? "" : "s", cfg.uri, where);
    else
        say("--fresh: %s holds no checkpoint to move aside", cfg.uri);
    return rc;
}

/* Refuse to take over a job that another launcher or operator is running; else start anew,
 * from the job's checkpoints (from scratch with --fresh). */
static int prepare_job(launcher *l)
{
    int rc = 0;
    edl_kv *leader = NULL;
    if (edl_etcd_get(l->c, edl_str(l->k.leader), &leader, NULL) == 0) {
        edl_generation g = {0};
        if (cli_read_generation(l->c, &l->k, &g) != EDL_ENOTFOUND &&
            !edl_job_state_final(g.state)) {
            fprintf(stderr, "edl run: job \"%s\" is already running in this etcd (job server "
                            "%.*s); stop it first (edl stop %s) or choose another --job\n",
                    l->o.job, (int)leader->value_len, leader->value, l->o.job);
            rc = EDL_ECONFLICT;
        }
        edl_generation_clear(&g);
    }
    edl_kv_free(leader);
    if (!rc && l->o.fresh && set_checkpoints_aside(l) != 0)
        return EDL_EINVAL;
    char *spec = rc ? NULL : edl_spec_to_json(&l->o.spec);
    if (!rc && !spec)
        rc = EDL_ENOMEM;
    if (!rc) {
        rc = delete_job_keys(l);
        if (!rc)
            rc = edl_etcd_put(l->c, edl_str(l->k.spec), edl_str(spec), NULL, NULL);
        if (rc)
            fprintf(stderr, "edl run: writing the job's spec: %s (%s)\n", edl_strerror(rc),
                    edl_etcd_errmsg(l->c));
    }
    free(spec);
    return rc;
}

/* A final state: the agents leave by themselves; make sure they do. */
static void on_final(launcher *l)
{
    l->final = true;
    for (size_t i = 0; i < l->n_kids; i++)
        if (!l->kids[i]->exited && !l->kids[i]->kill_at)
            l->kids[i]->kill_at = edl_monotonic_ms() + l->o.grace_ms + 10000;
}

/* The agents of each role that the spec asks for, within what one machine runs (a spec
 * written by someone else may ask for more: the job goes on at the limit). */
static void take_replicas(launcher *l, const edl_job_spec *sp)
{
    int want[N_ROLES] = {edl_spec_desired_pods(sp), edl_spec_desired_servers(sp),
                         edl_spec_desired_teachers(sp)};
    static const char *const what[N_ROLES] = {"replicas", "ps replicas", "teacher replicas"};
    if (want[0] + want[1] + want[2] > MAX_KIDS) {
        say("replicas %d + ps replicas %d + teacher replicas %d: this launcher runs at most %d "
            "agents on one machine; keeping %d", want[0], want[1], want[2], MAX_KIDS, MAX_KIDS);
        want[0] = want[0] < MAX_KIDS ? want[0] : MAX_KIDS;
        want[1] = want[1] < MAX_KIDS - want[0] ? want[1] : MAX_KIDS - want[0];
        want[2] = MAX_KIDS - want[0] - want[1];
    }
    for (int r = 0; r < N_ROLES; r++) {
        if (want[r] != l->desired[r])
            say("%s %d -> %d", what[r], l->desired[r], want[r]);
        l->desired[r] = want[r];
    }
}

/* "a b c" of a member list (bounded). */
static void pod_list(const edl_member *m, size_t n, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? " " : "", m[i].pod);
}

/* What each pod is in generation g: a member's rank or a server's index, for the prefix and
 * the log file of its lines from now on. The agents learn it from the same document at about
 * the same moment, so lines written around a re-formation (an old trainer's last words in its
 * grace period, a new one's first) may carry the rank of the generation after or before. */
static void take_ranks(launcher *l, const edl_generation *g)
{
    for (size_t i = 0; i < l->n_kids; i++) {
        child *k = l->kids[i];
        const edl_member *m = edl_generation_member_named(g, k->name);
        k->kind = m ? "rank" : NULL;
        k->num = m ? m->rank : 0;
        for (size_t j = 0; !m && j < g->n_servers; j++)
            if (strcmp(g->servers[j].pod, k->name) == 0) {
                k->kind = "server";
                k->num = g->servers[j].rank;
            }
    }
}

/* Re-read spec (replicas) and generation (number, state); print a line per generation. */
static void observe(launcher *l)
{
    edl_job_spec sp;
    edl_spec_init(&sp);
    if (cli_read_spec(l->c, &l->k, &sp, NULL) == 0)
        take_replicas(l, &sp);
    edl_spec_clear(&sp);
    edl_generation g = {0};
    if (cli_read_generation(l->c, &l->k, &g) == 0 &&
        (g.generation != l->gen || g.state != l->state)) {
        char members[1024], servers[512] = "";
        pod_list(g.members, g.n_members, members, sizeof members);
        if (g.n_servers) {
            char list[480];
            pod_list(g.servers, g.n_servers, list, sizeof list);
            snprintf(servers, sizeof servers, ", %zu servers [%s]", g.n_servers, list);
        }
        say("generation %lld %s: %zu members [%s]%s, %zu standby (%s)", (long long)g.generation,
            edl_job_state_name(g.state), g.n_members, members, servers, g.n_standbys,
            g.reason ? g.reason : "");
        l->gen = g.generation;
        l->state = g.state;
        take_ranks(l, &g);
        if (g.state == EDL_JOB_FAILED)
            snprintf(l->failed_why, sizeof l->failed_why, "%s", g.reason ? g.reason : "");
        if (edl_job_state_final(g.state) && !l->final)
            on_final(l);
    }
    edl_generation_clear(&g);
}

/* Whether an event can change what observe() reads: the spec or the generation. Pods and
 * trainer status (a write per pod per second while trainers report progress) cannot. */
static bool event_matters(const launcher *l, const edl_watch_event *ev)
{
    if (ev->type != EDL_WATCH_PUT && ev->type != EDL_WATCH_DELETE)
        return ev->type != EDL_WATCH_PROGRESS;
    edl_job_key_info ki;
    edl_job_key_kind kind = edl_job_key_parse(&l->k, ev->kv.key, ev->kv.key_len, &ki);
    return kind == EDL_KEY_SPEC || kind == EDL_KEY_GENERATION;
}

/* Start or stop agents of one role to match its desired count (newest stop first, as a
 * scale-down would). */
static int match_role(launcher *l, int role, int desired)
{
    size_t alive = role_alive(l, role);
    while (alive < (size_t)desired) {
        int rc = start_agent(l, role);
        if (rc) {
            say("cannot start an agent: %s", edl_strerror(rc));
            return rc;
        }
        alive++;
    }
    for (size_t i = l->n_kids; i-- > 0 && alive > (size_t)desired;) {
        child *k = l->kids[i];
        if (!k->exited && !k->stopping && k->role == role) {
            say("scaling down: stopping %s", k->name);
            stop_child(k, l->o.grace_ms + 5000);
            alive--;
        }
    }
    return 0;
}

static int match_replicas(launcher *l)
{
    if (l->final || l->interrupted)
        return 0;
    int rc = 0;
    for (int r = 0; r < N_ROLES && !rc; r++)
        rc = match_role(l, r, l->desired[r]);
    return rc;
}

/* An agent that died: its registration goes now (its lease revoked, the pod's keys with it),
 * so the job server publishes the loss at once rather than when the lease runs out, as the
 * operator does for a pod that failed. Names are never reused: the key is no one else's. */
static void revoke_dead_agent(launcher *l, const child *k)
{
    char *key = edl_job_key_pod(&l->k, k->name);
    int rc = key ? edl_etcd_lease_revoke_holder(l->c, edl_str(key), NULL) : EDL_ENOMEM;
    if (rc && rc != EDL_ENOTFOUND)
        say("cannot revoke the lease of %s (%s): the job server notices its loss when the "
            "lease expires", k->name, edl_strerror(rc));
    free(key);
}

/* Reap children; an agent that died unexpectedly is replaced by a new pod. */
static int reap(launcher *l)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        child *k = pid == l->js.pid ? &l->js : NULL;
        for (size_t i = 0; !k && i < l->n_kids; i++)
            if (l->kids[i]->pid == pid)
                k = l->kids[i];
        if (!k)
            continue;
        pump(l, k, true);
        k->exited = true;
        k->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (k == &l->js) {
            if (!l->interrupted && !l->final) {
                say("the job server exited (%d); restarting it", k->status);
                close_log(&l->js);
                if (l->js.out >= 0) /* its output still coming: no longer pumped */
                    close_output(l, &l->js);
                memset(&l->js, 0, sizeof l->js);
                l->js.out = -1;
                l->js.log_fd = -1;
                if (start_jobserver(l) != 0)
                    return EDL_EXIT_UNREACHABLE;
            }
            continue;
        }
        if (l->final || l->interrupted)
            continue;
        /* Whatever we were doing with it: a scale-down may have picked an agent that had died
         * but was not reaped yet, and its loss must not wait for the lease to expire. An
         * agent that left cleanly took its lease with it (nothing to revoke). */
        revoke_dead_agent(l, k);
        if (k->stopping)
            continue;
        if (k->status == EDL_EXIT_USAGE) {
            say("%s exited with a configuration error (2); giving up", k->name);
            return EDL_EXIT_USAGE;
        }
        if (k->role == ROLE_PS && k->status == 0) { /* its server drained and left */
            say("%s left (exit 0); a new pod replaces it while ps.replicas asks for it", k->name);
            continue;
        }
        say("%s exited unexpectedly (%s %d): its lease revoked; starting a replacement",
            k->name, WIFEXITED(st) ? "code" : "signal",
            WIFEXITED(st) ? k->status : k->status - 128);
    }
    return 0;
}

static void drop_exited(launcher *l)
{
    size_t j = 0;
    for (size_t i = 0; i < l->n_kids; i++) {
        child *k = l->kids[i];
        if (k->exited && k->out < 0) {
            close_log(k);
            free(k);
        } else {
            l->kids[j++] = k;
        }
    }
    l->n_kids = j;
}

static void on_signal(edl_loop *lp, int sig, void *arg)
{
    (void)lp;
    launcher *l = arg;
    if (sig == SIGCHLD)
        return; /* reaped after the turn */
    if (!l->interrupted) {
        l->interrupted = sig;
        say("signal %d: stopping the agents (again to kill them)", sig);
        for (size_t i = 0; i < l->n_kids; i++)
            stop_child(l->kids[i], l->o.grace_ms + 5000);
    } else {
        for (size_t i = 0; i < l->n_kids; i++)
            if (!l->kids[i]->exited)
                kill(l->kids[i]->pid, SIGKILL);
    }
}

static void set_stopped(edl_job_spec *s, void *arg)
{
    (void)arg;
    s->stopped = true;
}

/* How often a failed write of the deadline's stop is tried again, and the job read again when
 * there is no watch. */
#define RETRY_MS 200

/* When the manifest's activeDeadlineSeconds is due (0: none, or done with). */
static int64_t deadline_due(void *arg)
{
    const launcher *l = arg;
    if (l->o.deadline_s < 0 || l->final || l->interrupted || l->deadline_stopped)
        return 0;
    return l->deadline_passed ? l->deadline_retry_ms : l->started_ms + l->o.deadline_s * 1000;
}

/* The manifest's activeDeadlineSeconds, as the operator applies it: once the job has run this
 * long it is stopped (trainers get SIGTERM and the grace period) and ends as failed. */
static void check_deadline(edl_loop *lp, void *arg)
{
    (void)lp;
    launcher *l = arg;
    if (!l->deadline_passed)
        say("activeDeadlineSeconds (%lld s) passed: stopping the job; it ends as failed",
            (long long)l->o.deadline_s);
    l->deadline_passed = true;
    edl_job_spec before, after;
    edl_spec_init(&before);
    edl_spec_init(&after);
    if (cli_update_spec(l->c, &l->k, set_stopped, NULL, &before, &after) == 0)
        l->deadline_stopped = true;
    else
        l->deadline_retry_ms = edl_monotonic_ms() + RETRY_MS;
    edl_spec_clear(&before);
    edl_spec_clear(&after);
}

/* A child's output: pumped (the child is the one whose pipe this is). */
static void on_output(edl_loop *lp, int fd, int events, void *arg)
{
    (void)lp, (void)events;
    launcher *l = arg;
    child *k = l->js.out == fd ? &l->js : NULL;
    for (size_t i = 0; !k && i < l->n_kids; i++)
        if (l->kids[i]->out == fd)
            k = l->kids[i];
    if (k)
        pump(l, k, false);
}

static int watch_fd(void *arg, int *events)
{
    (void)events;
    const launcher *l = arg;
    return l->w ? edl_watch_fd(l->w) : -1;
}

static void on_watch(edl_loop *lp, int fd, int events, void *arg)
{
    (void)lp, (void)fd, (void)events, (void)arg; /* read after the turn (follow_job) */
}

/* Without a watch (it failed to open, or ended), the job is read every RETRY_MS. */
static int64_t poll_due(void *arg)
{
    return ((const launcher *)arg)->poll_due_ms;
}

static void poll_job(edl_loop *lp, void *arg)
{
    (void)lp;
    launcher *l = arg;
    observe(l);
    l->poll_due_ms = l->w ? 0 : edl_monotonic_ms() + RETRY_MS;
}

/* The watch's events: observe the job again when one matters; a watch that fails is dropped
 * for polling (poll_job). */
static void follow_job(launcher *l)
{
    edl_watch_event *ev;
    bool changed = false;
    while (l->w && edl_watch_next(l->w, &ev, 0) == 0) {
        changed = changed || event_matters(l, ev);
        if (ev->type == EDL_WATCH_ERROR) {
            edl_watch_event_free(ev);
            edl_watch_close(l->w);
            l->w = NULL;
            l->poll_due_ms = edl_monotonic_ms(); /* read now, then every RETRY_MS */
            break;
        }
        edl_watch_event_free(ev);
    }
    if (changed)
        observe(l);
}

/* The earliest time a stopping child is killed (0: none is). */
static int64_t kill_due(void *arg)
{
    const launcher *l = arg;
    int64_t due = 0;
    for (size_t i = 0; i < l->n_kids; i++) {
        const child *k = l->kids[i];
        if (!k->exited && k->kill_at && (!due || k->kill_at < due))
            due = k->kill_at;
    }
    return due;
}

static void kill_late_children(edl_loop *lp, void *arg)
{
    (void)lp;
    launcher *l = arg;
    int64_t now = edl_monotonic_ms();
    for (size_t i = 0; i < l->n_kids; i++)
        if (!l->kids[i]->exited && l->kids[i]->kill_at && now >= l->kids[i]->kill_at) {
            say("%s did not stop in time: killing it", l->kids[i]->name);
            kill(l->kids[i]->pid, SIGKILL);
            l->kids[i]->kill_at = 0;
        }
}

/* After every wake-up (a child's exit or output, the watch, a signal, a timer): reap, follow
 * the job, match the replicas; the run ends on an error or once the job is over and its agents
 * gone. What is due at a time (the deadline, a late child's kill, a read without a watch) is a
 * timer instead: a turn caused by an fd does not run it. */
static void after_turn(edl_loop *lp, void *arg)
{
    launcher *l = arg;
    int rc = reap(l);
    follow_job(l);
    if (!rc)
        rc = match_replicas(l);
    drop_exited(l);
    if (rc || ((l->final || l->interrupted) && agents_alive(l, true) == 0))
        edl_loop_stop(lp, rc);
}

static int loop(launcher *l)
{
    int rc = edl_loop_fd_follow(l->loop, watch_fd, on_watch, l);
    rc = rc ? rc : edl_loop_timer_follow(l->loop, deadline_due, check_deadline, l);
    rc = rc ? rc : edl_loop_timer_follow(l->loop, kill_due, kill_late_children, l);
    rc = rc ? rc : edl_loop_timer_follow(l->loop, poll_due, poll_job, l);
    if (rc) {
        say("cannot follow the job: %s", edl_strerror(rc));
        return EDL_EXIT_FAILED;
    }
    edl_loop_after_turn(l->loop, after_turn, l);
    after_turn(l->loop, l); /* the agents start now, not at the first wake-up */
    return edl_loop_run(l->loop);
}

/* ---- options ------------------------------------------------------------------------------ */

static const char run_usage[] =
    "Usage: edl run --np MIN:MAX [--ps MIN:MAX] [--teachers MIN:MAX --service NAME] [options]\n"
    "               -- TRAINER [ARGS...]\n"
    "       edl run -f JOB.yaml [options]\n"
    "\n"
    "Runs an elastic job on this machine: its own etcd on a free loopback port (unless --etcd),\n"
    "a job server, and one agent per replica, each supervising one TRAINER process. Output is\n"
    "prefixed with the rank and the pod (`[rank 0 edl-job-1] ...`) and kept by pod and rank\n"
    "for `edl logs JOB [--rank N]`. Change the size from another terminal with\n"
    "`edl scale JOB N` (servers: --role ps, teachers: --role teacher); see it with\n"
    "`edl status JOB`;\n"
    "end it with `edl stop JOB`.\n"
    "\n"
    "With -f, the job is the file's first TrainingJob (deploy/k8s/crd.yaml; docs/manifest.md):\n"
    "its name is the job's, minReplicas:maxReplicas, replicas and the elastic settings are the\n"
    "spec, the first container's command and args are the trainer (a bare name not on PATH is\n"
    "looked for beside edl and in its build tree's examples/), its env values and workingDir\n"
    "apply, and activeDeadlineSeconds fails the job when it passes. Fields only a cluster uses\n"
    "(image, resources, volumes, ...) are named as ignored, but a file:// checkpoint URI under a\n"
    "volumeMount's mountPath becomes this user's directory for the volume (its claim, else its\n"
    "name): ${TMPDIR:-/tmp}/edl-volumes-<uid>/<claim>, 0700, kept between runs like a claim,\n"
    "so users of one host do not share it. Flags given beside -f override the\n"
    "manifest; a trainer after -- is refused. A problem in it, a field the CRD does not have\n"
    "among them (as kubectl refuses it): FILE:LINE: FIELD: what, exit 2.\n"
    "\n"
    "Options:\n"
    "  -f, --file JOB.yaml       run the TrainingJob of this manifest\n"
    "  --np MIN:MAX              members the job trains with (a single N means N:N)\n"
    "  --replicas N              agents to start (default: MAX); beyond MAX they are standbys\n"
    "  --ps MIN[:MAX]            parameter servers: as many more agents with --role ps run the\n"
    "                            same TRAINER (it reads TRAINING_ROLE: TRAINER or PSERVER);\n"
    "                            pods <job>-ps-N; the job trains with MIN to MAX servers\n"
    "  --ps-replicas N           ps agents to start (default: the MAX of --ps), 0..MAX\n"
    "  --teachers MIN[:MAX]      teachers (distillation, docs/distill.md): agents with --role\n"
    "                            teacher run the same TRAINER as an inference server (it reads\n"
    "                            EDL_ROLE_NAME=teacher and listens on $PORT); pods\n"
    "                            <job>-teacher-N register in --service; no member, no rank\n"
    "  --service NAME            the teachers' service (required with --teachers)\n"
    "  --teacher-replicas N      teacher agents to start (default: the MAX of --teachers)\n"
    "  --job NAME                job name (default: edl-job)\n"
    "  --insecure                start our own etcd on plain http, without TLS (for debugging)\n"
    "  --prefix PREFIX           etcd key prefix, starting with '/' (default: " EDL_DEFAULT_PREFIX
    ")\n"
    "  --ttl SECONDS             agents' lease TTL: how long a crashed pod goes unnoticed (10)\n"
    "  --settle-ms MS            joins within this window form one generation (1000)\n"
    "  --max-restarts N          restart budget for trainer failures (10)\n"
    "  --restart-policy P        OnFailure (default), ExitCode or Never\n"
    "  --permanent-exit-codes L  for ExitCode: codes that fail the job at once (1-127)\n"
    "  --no-fail-fast            the script's own error (every rank failing by itself, one\n"
    "                            failing the same way twice, an exception edl.torch marks)\n"
    "                            spends restarts like any failure instead of failing the job\n"
    "  --progress-timeout-ms MS  a rank whose step stalls this long is failed (0: off)\n"
    "  --exclude-after N         failures of one pod before it is excluded for a while (2)\n"
    "  --cooldown-ms MS          first exclusion; doubles with each further failure (10000)\n"
    "  --elastic-mode MODE       restart or inprocess (default: the trainer's; edl.torch\n"
    "                            asks for inprocess, other trainers get restart)\n"
    "  --checkpoint-uri URI      given to trainers as EDL_CHECKPOINT_URI; a job run again\n"
    "                            resumes from the newest complete checkpoint there\n"
    "  --fresh                   start over: move the URI's checkpoints to\n"
    "                            URI/previous-<UTC time>/ (file:// only) and forget them\n"
    "  --grace-ms MS             SIGTERM-to-SIGKILL grace for trainers (10000)\n"
    "  -h, --help                this text\n"
    "\n"
    "Our own etcd requires TLS client certificates: a throwaway CA and certificates are made\n"
    "in a private (0700) directory, given to the job server and agents (and by them to the\n"
    "trainers as EDL_ETCD_CACERT/CERT/KEY), and deleted at the end. To use an etcd of yours\n"
    "instead, give --etcd (EDL_ETCD_ENDPOINTS alone does not) and, as it needs, the other\n"
    "flags below (those default to their EDL_ETCD_* variables):\n"
    EDL_ETCD_OPTIONS_HELP
    "The trainers' collective links are authenticated with a job secret made for this run (a\n"
    "0600 file in the state directory, named by EDL_JOB_SECRET_FILE, removed at the end); a\n"
    "secret already named by EDL_JOB_SECRET_FILE or EDL_JOB_SECRET is used instead.\n"
    "\n"
    "The state directory ($EDL_STATE_DIR, else $XDG_RUNTIME_DIR/edl, else /tmp/edl-<uid>) holds\n"
    "the state file by which edl status, scale and stop find the job, its certificates and\n"
    "secret, and the agents' directories: it must be this user's and not writable by others\n"
    "(0700 or 0755), else edl run refuses to start. One edl run per job on a machine: a second\n"
    "is refused while the first runs; what one killed outright left is taken over.\n"
    "Ctrl-C stops the agents (and their trainers), then the job server, then etcd; again: kills\n"
    "the agents.\n"
    "\n"
    "Exit codes: 0 the job succeeded, 1 it failed, 2 usage error, 3 etcd could not be started\n"
    "or reached, or refused our TLS certificate or credentials (the message names the\n"
    "endpoint), 4 the job was stopped (edl stop), 130/143 interrupted by SIGINT/SIGTERM.\n";

/* "MIN:MAX" or "N" (= N:N), 1 <= MIN <= MAX <= hi: --np and --ps. */
static int parse_np(const char *s, int hi, int *min, int *max)
{
    char *end;
    long a = strtol(s, &end, 10), b = a;
    if (end == s || a < 1 || a > hi)
        return -1;
    if (*end == ':') {
        const char *t = end + 1;
        b = strtol(t, &end, 10);
        if (end == t || b < a || b > hi)
            return -1;
    }
    if (*end)
        return -1;
    *min = (int)a;
    *max = (int)b;
    return 0;
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "edl run: %s %s: expected a whole number from %ld to %ld\n", opt, s, lo,
                hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* The settings of an etcd of the user's (flags, else EDL_ETCD_*), or none with --insecure. */
static int check_etcd_opts(run_opts *o)
{
    char err[600];
    bool given = o->etcd.n_endpoints > 0;
    if (o->insecure && given) {
        fprintf(stderr, "edl run: --insecure is for our own etcd; with --etcd, the URL's scheme "
                        "decides\n");
        return -1;
    }
    if (!given && (o->etcd.ca_file || o->etcd.cert_file || o->etcd.key_file || o->etcd.username ||
                   o->etcd.password_file)) {
        fprintf(stderr, "edl run: --cacert, --cert, --key, --user and --password-file are for "
                        "an etcd of yours (--etcd); our own makes its certificates\n");
        return -1;
    }
    if (given && (edl_etcd_config_from_env(&o->etcd, err, sizeof err) ||
                  edl_etcd_config_check(&o->etcd, err, sizeof err))) {
        fprintf(stderr, "edl run: %s\n", err);
        return -1;
    }
    return 0;
}

static const struct option run_options[] = {
    {"np", required_argument, 0, 'n'},          {"replicas", required_argument, 0, 'r'},
    {"ps", required_argument, 0, 'S'},          {"ps-replicas", required_argument, 0, 'R'},
    {"teachers", required_argument, 0, 'A'},    {"teacher-replicas", required_argument, 0, 'B'},
    {"service", required_argument, 0, 'V'},
    {"job", required_argument, 0, 'j'},         EDL_ETCD_LONG_OPTIONS,
    {"insecure", no_argument, 0, 'I'},
    {"prefix", required_argument, 0, 'p'},      {"ttl", required_argument, 0, 't'},
    {"settle-ms", required_argument, 0, 's'},   {"max-restarts", required_argument, 0, 'm'},
    {"restart-policy", required_argument, 0, 'P'},
    {"permanent-exit-codes", required_argument, 0, 'C'},
    {"progress-timeout-ms", required_argument, 0, 'T'},
    {"elastic-mode", required_argument, 0, 'M'},
    {"checkpoint-uri", required_argument, 0, 'u'},
    {"grace-ms", required_argument, 0, 'g'},    {"help", no_argument, 0, 'h'},
    {"exclude-after", required_argument, 0, 'x'}, {"cooldown-ms", required_argument, 0, 'c'},
    {"file", required_argument, 0, 'f'},        {"fresh", no_argument, 0, 'F'},
    {"no-fail-fast", no_argument, 0, 'N'},
    {0, 0, 0, 0},
};

/* -f FILE, wherever it is among the options (the manifest is read first; the other flags then
 * override what it says). *help: --help was given; *ckpt: --checkpoint-uri was (the manifest's
 * is then not used, nor its volume's directory made). */
static const char *find_file_flag(int argc, char **argv, bool *help, bool *ckpt)
{
    const char *file = NULL;
    int ch, idx = 0;
    opterr = 0;
    optind = 0;
    while ((ch = getopt_long(argc, argv, "+hf:", run_options, &idx)) != -1) {
        if (ch == 'f')
            file = optarg;
        *help = *help || ch == 'h';
        *ckpt = *ckpt || ch == 'u';
    }
    opterr = 1;
    optind = 0;
    return file;
}

/* The manifest's spec, job name and deadline, as if given by flags: 0 or -1 (printed). */
static int apply_manifest(run_opts *o, bool ckpt_flag)
{
    if (cli_manifest_load(o->file, !ckpt_flag, &o->m) != 0)
        return -1;
    if (edl_spec_copy(&o->spec, &o->m.tj.spec) != 0) {
        fprintf(stderr, "edl run: out of memory\n");
        return -1;
    }
    o->job = o->m.tj.name;
    o->deadline_s = o->m.tj.active_deadline_s;
    return 0;
}

/* --teachers, --service and --teacher-replicas go together; the teachers' pod names
 * (<job>-teacher-N) are their instance names in the service, so DNS labels. 0 or -1. */
static int check_teacher_opts(const run_opts *o)
{
    bool svc = o->spec.teachers_service[0] != '\0';
    if (o->spec.teachers_max == 0 && (svc || o->spec.teachers_replicas >= 0)) {
        fprintf(stderr, "edl run: --service and --teacher-replicas need --teachers MIN[:MAX]\n");
        return -1;
    }
    if (o->spec.teachers_max == 0)
        return 0;
    if (!svc) {
        fprintf(stderr, "edl run: --teachers needs --service NAME (where the teachers "
                        "register)\n");
        return -1;
    }
    char name[EDL_NAME_MAX + 32];
    snprintf(name, sizeof name, "%s-teacher-%d", o->job, EDL_TEACHERS_MAX);
    if (!edl_teacher_service_valid(name)) {
        fprintf(stderr, "edl run: with --teachers the job name \"%s\" must give teacher pod "
                        "names (%s-teacher-N) that are service instance names: [a-z0-9-], at "
                        "most %d characters in all\n", o->job, o->job,
                EDL_TEACHER_SERVICE_MAX);
        return -1;
    }
    return 0;
}

static int parse_run(int argc, char **argv, run_opts *o)
{
    edl_spec_init(&o->spec);
    o->job = "edl-job";
    o->prefix = EDL_DEFAULT_PREFIX;
    o->grace_ms = 10000;
    o->deadline_s = -1;
    bool help = false, ckpt_flag = false;
    o->file = find_file_flag(argc, argv, &help, &ckpt_flag);
    if (o->file && !help && apply_manifest(o, ckpt_flag) != 0)
        return -1;
    bool have_np = o->file != NULL;
    int ch, idx = 0;
    long v;
    while ((ch = getopt_long(argc, argv, "+hf:", run_options, &idx)) != -1) {
        switch (ch) {
        case 'f': break; /* read above */
        case EDL_ETCD_OPT:
            if (cli_etcd_option(&o->etcd, run_options[idx].name, optarg))
                return -1;
            break;
        case 'I': o->insecure = true; break;
        case 'F': o->fresh = true; break;
        case 'N': o->spec.fail_fast = false; break;
        case 'n':
            if (parse_np(optarg, EDL_MEMBERS_MAX, &o->spec.min, &o->spec.max)) {
                fprintf(stderr, "edl run: --np %s: expected MIN:MAX or N, 1 <= MIN <= MAX\n",
                        optarg);
                return -1;
            }
            have_np = true;
            break;
        case 'r':
            if (parse_long("--replicas", optarg, 0, EDL_MEMBERS_MAX, &v))
                return -1;
            o->spec.replicas = (int)v;
            break;
        case 'S':
            if (parse_np(optarg, EDL_PS_SERVERS_MAX, &o->spec.ps_min, &o->spec.ps_max)) {
                fprintf(stderr, "edl run: --ps %s: expected MIN:MAX or N, 1 <= MIN <= MAX <= "
                                "%d\n", optarg, EDL_PS_SERVERS_MAX);
                return -1;
            }
            break;
        case 'R':
            if (parse_long("--ps-replicas", optarg, 0, EDL_PS_SERVERS_MAX, &v))
                return -1;
            o->spec.ps_replicas = (int)v;
            break;
        case 'A':
            if (parse_np(optarg, EDL_TEACHERS_MAX, &o->spec.teachers_min,
                         &o->spec.teachers_max)) {
                fprintf(stderr, "edl run: --teachers %s: expected MIN:MAX or N, 1 <= MIN <= MAX "
                                "<= %d\n", optarg, EDL_TEACHERS_MAX);
                return -1;
            }
            break;
        case 'B':
            if (parse_long("--teacher-replicas", optarg, 0, EDL_TEACHERS_MAX, &v))
                return -1;
            o->spec.teachers_replicas = (int)v;
            break;
        case 'V':
            snprintf(o->spec.teachers_service, sizeof o->spec.teachers_service, "%s", optarg);
            if (strlen(optarg) >= sizeof o->spec.teachers_service ||
                !edl_teacher_service_valid(optarg)) {
                fprintf(stderr, "edl run: --service %s: expected 1-63 of [a-z0-9-], not "
                                "starting or ending with '-'\n", optarg);
                return -1;
            }
            break;
        case 'j': o->job = optarg; break;
        case 'p': o->prefix = optarg; break;
        case 't':
            if (parse_long("--ttl", optarg, 1, 86400, &v))
                return -1;
            o->spec.ttl_s = v;
            break;
        case 's':
            if (parse_long("--settle-ms", optarg, 0, 86400000, &v))
                return -1;
            o->spec.settle_ms = v;
            break;
        case 'm':
            if (parse_long("--max-restarts", optarg, 0, EDL_RESTARTS_MAX, &v))
                return -1;
            o->spec.max_restarts = (int)v;
            break;
        case 'P':
            if (edl_restart_policy_parse(optarg, &o->spec.restart_policy) != 0) {
                fprintf(stderr, "edl run: --restart-policy %s: expected OnFailure, ExitCode or "
                                "Never\n", optarg);
                return -1;
            }
            break;
        case 'C':
            if (edl_exit_codes_parse(optarg, o->spec.permanent_codes)) {
                fprintf(stderr, "edl run: --permanent-exit-codes %s: expected a list such as "
                                "1-127,200\n", optarg);
                return -1;
            }
            break;
        case 'T':
            if (parse_long("--progress-timeout-ms", optarg, 0, 86400000, &v))
                return -1;
            o->spec.progress_timeout_ms = v;
            break;
        case 'M':
            if (edl_elastic_mode_parse(optarg, &o->spec.mode) != 0) {
                fprintf(stderr, "edl run: --elastic-mode %s: expected restart, inprocess or "
                        "auto\n", optarg);
                return -1;
            }
            break;
        case 'u':
            free(o->spec.checkpoint_uri);
            o->spec.checkpoint_uri = strdup(optarg);
            break;
        case 'x':
            if (parse_long("--exclude-after", optarg, 1, EDL_RESTARTS_MAX, &v))
                return -1;
            o->spec.exclude_after = (int)v;
            break;
        case 'c':
            if (parse_long("--cooldown-ms", optarg, 0, 86400000, &v))
                return -1;
            o->spec.cooldown_ms = v;
            if (o->spec.cooldown_max_ms < v)
                o->spec.cooldown_max_ms = v;
            break;
        case 'g':
            if (parse_long("--grace-ms", optarg, 0, 3600000, &v))
                return -1;
            o->grace_ms = v;
            break;
        case 'h': printf("%s", run_usage); exit(0);
        default: fprintf(stderr, "%s", run_usage); return -1;
        }
    }
    if (!have_np) {
        fprintf(stderr, "edl run: --np MIN:MAX is required (see --help)\n");
        return -1;
    }
    if (check_etcd_opts(o) != 0)
        return -1;
    char err[256];
    if (o->spec.ps_replicas >= 0 && o->spec.ps_max == 0) {
        fprintf(stderr, "edl run: --ps-replicas needs --ps MIN:MAX\n");
        return -1;
    }
    if (check_teacher_opts(o) != 0)
        return -1;
    if (!o->file && edl_spec_validate(&o->spec, err, sizeof err) != 0) { /* -f: below */
        fprintf(stderr, "edl run: %s\n", err);
        return -1;
    }
    int agents = edl_spec_desired_pods(&o->spec) + edl_spec_desired_servers(&o->spec) +
                 edl_spec_desired_teachers(&o->spec);
    if (agents > MAX_KIDS) {
        fprintf(stderr, "edl run: %d agents asked for (--replicas, else the MAX of --np, and "
                        "the servers of --ps); edl run starts at most %d on one machine\n",
                agents, MAX_KIDS);
        return -1;
    }
    if (!edl_name_valid(o->job)) {
        fprintf(stderr, "edl run: job name \"%s\" is not valid: use 1-128 of [A-Za-z0-9._-], "
                        "not starting with '.' or '-'\n", o->job);
        return -1;
    }
    if (!edl_prefix_valid(o->prefix)) { /* before anything starts: the agents refuse it */
        fprintf(stderr, "edl run: --prefix '%s': " EDL_PREFIX_RULE "\n", o->prefix);
        return -1;
    }
    if (o->file) {
        if (optind < argc) {
            fprintf(stderr, "edl run: -f %s: the trainer's command comes from the manifest "
                            "(spec.template.spec.containers[0].command and args); give none "
                            "after the options\n", o->file);
            return -1;
        }
        if (edl_spec_validate(&o->spec, err, sizeof err) != 0) {
            fprintf(stderr, "edl run: -f %s with the flags given: %s\n", o->file, err);
            return -1;
        }
        o->trainer = o->m.tj.command;
        return 0;
    }
    if (optind >= argc) {
        fprintf(stderr, "edl run: no trainer given: edl run --np MIN:MAX -- TRAINER [ARGS...]\n");
        return -1;
    }
    o->trainer = &argv[optind];
    return 0;
}

static int job_exit_code(const launcher *l)
{
    if (l->interrupted)
        return 128 + l->interrupted;
    return l->deadline_passed ? EDL_EXIT_FAILED : edl_job_exit_code(l->state);
}

static void shutdown_rest(launcher *l)
{
    for (size_t i = 0; i < l->n_kids; i++)
        if (!l->kids[i]->exited)
            kill(l->kids[i]->pid, SIGKILL);
    if (l->js.pid && !l->js.exited) {
        kill(l->js.pid, SIGTERM);
        for (int t = 0; t < 100 && waitpid(l->js.pid, NULL, WNOHANG) == 0; t++)
            usleep(50 * 1000);
        kill(l->js.pid, SIGKILL);
        waitpid(l->js.pid, NULL, 0);
        l->js.exited = true;
    }
    if (l->js.out >= 0)
        pump(l, &l->js, true);
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    for (size_t i = 0; i < l->n_kids; i++) {
        if (l->kids[i]->out >= 0)
            close(l->kids[i]->out);
        close_log(l->kids[i]);
        free(l->kids[i]);
    }
    close_log(&l->js);
    l->n_kids = 0;
}

/* The loop, asleep until a child, the watch, a signal (on its signalfd) or a timer wakes it. */
static int open_loop(launcher *l)
{
    signal(SIGPIPE, SIG_IGN);
    int rc = edl_loop_open(-1, &l->loop);
    return rc ? rc : edl_loop_signals(l->loop, EDL_SIGNALS_STOP | EDL_SIGNALS_CHILD |
                                      EDL_SIGNALS_HUP, on_signal, l);
}

/* Our own etcd's throwaway CA and certificates, in l->tls_dir: 0 or an exit code. */
static int make_certs(launcher *l)
{
    char why[700];
    int rc = cli_state_tls_dir(l->o.job, l->tls_dir, sizeof l->tls_dir, why, sizeof why);
    if (rc) {
        l->tls_dir[0] = '\0';
        fprintf(stderr, "edl run: %s\n", why);
        return EDL_EXIT_UNREACHABLE;
    }
    if ((rc = edl_etcd_tls_make(l->tls_dir, 30, why, sizeof why)) != 0) {
        fprintf(stderr, "edl run: certificates for our etcd: %s (or run with --insecure)\n", why);
        return EDL_EXIT_UNREACHABLE;
    }
    return 0;
}

/* The job secret that authenticates the trainers' links (edl/secret.h): one from the
 * environment is used as it is; otherwise a fresh one per run, in the private state directory,
 * named to the agents (and through them the trainers) by EDL_JOB_SECRET_FILE and removed at
 * the end of the run. */
static int prepare_secret(launcher *l)
{
    const char *f = getenv(EDL_SECRET_FILE_ENV), *v = getenv(EDL_SECRET_ENV);
    if ((f && *f) || (v && *v))
        return 0;
    char why[700];
    if (cli_state_new_secret(l->o.job, l->secret, sizeof l->secret, why, sizeof why) != 0) {
        l->secret[0] = '\0';
        fprintf(stderr, "edl run: cannot make the job secret: %s\n", why);
        return EDL_EXIT_USAGE;
    }
    setenv(EDL_SECRET_FILE_ENV, l->secret, 1);
    return 0;
}

/* A file of l->tls_dir (malloc'ed, NULL without TLS). */
static char *tls_file(const launcher *l, const char *name)
{
    char *p = NULL;
    if (l->tls_dir[0] && asprintf(&p, "%s/%s", l->tls_dir, name) < 0)
        p = NULL;
    return p;
}

/* Our own etcd on loopback, https with client certificates unless --insecure; l->cfg reaches
 * it. 0 or an exit code. */
static int start_own_etcd(launcher *l)
{
    int rc = l->o.insecure ? 0 : make_certs(l);
    if (rc)
        return rc;
    l->cfg.ca_file = tls_file(l, EDL_ETCD_TLS_CA);
    l->cfg.cert_file = tls_file(l, EDL_ETCD_TLS_CLIENT_CERT);
    l->cfg.key_file = tls_file(l, EDL_ETCD_TLS_CLIENT_KEY);
    char *srv_cert = tls_file(l, EDL_ETCD_TLS_SERVER_CERT);
    char *srv_key = tls_file(l, EDL_ETCD_TLS_SERVER_KEY);
    edl_etcd_server_opts so = {.quiet = true, .tls_cert_file = srv_cert, .tls_key_file = srv_key,
                               .tls_ca_file = l->cfg.ca_file, .tls_client_cert_auth = !l->o.insecure,
                               .tls_client_cert_file = l->cfg.cert_file,
                               .tls_client_key_file = l->cfg.key_file,
                               .new_group = true}; /* Ctrl-C: it goes last (see finish) */
    rc = edl_etcd_server_open(&so, &l->srv);
    free(srv_cert);
    free(srv_key);
    if (rc) {
        fprintf(stderr, "edl run: could not start etcd (%s); is etcd installed "
                        "(Debian: apt-get install etcd-server)? Or pass --etcd URL.\n",
                edl_strerror(rc));
        return EDL_EXIT_UNREACHABLE;
    }
    rc = edl_etcd_config_set_endpoints(&l->cfg, edl_etcd_server_endpoints(l->srv));
    if (l->o.insecure)
        say("started etcd at %s without TLS (--insecure; data in %s, removed at exit)",
            edl_etcd_server_endpoints(l->srv), edl_etcd_server_data_dir(l->srv));
    else
        say("started etcd at %s, client certificates required (certificates in %s, data in "
            "%s, both removed at exit)", edl_etcd_server_endpoints(l->srv), l->tls_dir,
            edl_etcd_server_data_dir(l->srv));
    return rc ? EDL_EXIT_UNREACHABLE : 0;
}

/* The given etcd, or one of our own on loopback; a client of it and the children's
 * environment. 0 or an exit code. */
static int open_etcd(launcher *l)
{
    static const char *const names[] = {EDL_ETCD_ENV_NAMES, NULL};
    char **env = NULL;
    int rc = 0;
    if (l->o.etcd.n_endpoints > 0)
        l->cfg = l->o.etcd; /* moved: o.etcd no longer owns it */
    else
        rc = start_own_etcd(l);
    memset(&l->o.etcd, 0, sizeof l->o.etcd);
    if (rc)
        return rc;
    /* the manifest's env values reach the trainers through the agents, as in a container */
    char **base = l->o.m.env ? edl_env_build(NULL, NULL, l->o.m.env) : NULL;
    if ((l->o.m.env && !base) || edl_etcd_config_env(&l->cfg, &env) != 0 ||
        !(l->child_env = edl_env_build(base, names, env)) || edl_etcd_open(&l->cfg, &l->c) != 0) {
        fprintf(stderr, "edl run: cannot set up the etcd client\n");
        rc = EDL_EXIT_USAGE;
    }
    edl_env_free(base);
    edl_env_free(env);
    return rc;
}

/* The job in etcd, the state file, the watch and the job server; then the loop until the job
 * ends. Returns the exit code. */
static int run_job(launcher *l, bool *wrote_state)
{
    int rc = prepare_job(l);
    if (rc)
        return rc == EDL_ECONFLICT || rc == EDL_EINVAL ? EDL_EXIT_USAGE : EDL_EXIT_UNREACHABLE;
    char why[700];
    if (cli_state_write(l->o.job, &l->cfg, why, sizeof why) != 0)
        say("warning: no state file for edl scale/status/stop (pass them --etcd): %s", why);
    else
        *wrote_state = true;
    edl_watch_opts wo = {.prefix = true};
    if (edl_watch_open(l->c, edl_str(l->k.job), &wo, &l->w) != 0)
        l->w = NULL;
    l->poll_due_ms = l->w ? 0 : edl_monotonic_ms(); /* without a watch: polls (poll_job) */
    if (l->o.spec.ps_max > 0)
        say("job %s: min %d, max %d, replicas %d; servers: min %d, max %d, replicas %d; "
            "trainer: %s", l->o.job, l->o.spec.min, l->o.spec.max, l->desired[ROLE_W],
            l->o.spec.ps_min,
            l->o.spec.ps_max, l->desired[ROLE_PS], l->o.trainer[0]);
    else
        say("job %s: min %d, max %d, replicas %d; trainer: %s", l->o.job, l->o.spec.min,
            l->o.spec.max, l->desired[ROLE_W], l->o.trainer[0]);
    if (l->o.spec.teachers_max > 0)
        say("teachers: min %d, max %d, replicas %d, service %s (edl-agent --role teacher)",
            l->o.spec.teachers_min, l->o.spec.teachers_max, l->desired[ROLE_T],
            l->o.spec.teachers_service);
    if (start_jobserver(l) != 0) {
        fprintf(stderr, "edl run: cannot start %s\n", l->js_bin);
        return EDL_EXIT_USAGE;
    }
    l->ran = true;
    rc = loop(l);
    return rc ? rc : job_exit_code(l);
}

/* The manifest's workingDir: the launcher moves there, so that the agents and their trainers
 * start there (the programs found so far are made absolute first). 0 or an exit code. */
static int enter_working_dir(launcher *l)
{
    const char *wd = l->o.m.working_dir;
    if (!wd)
        return 0;
    char *bins[] = {l->agent_bin, l->js_bin};
    for (size_t i = 0; i < 2; i++) {
        char real[PATH_MAX];
        if (strchr(bins[i], '/') && bins[i][0] != '/' && realpath(bins[i], real))
            snprintf(bins[i], PATH_MAX, "%s", real);
    }
    if (chdir(wd) != 0) {
        fprintf(stderr, "edl run: %s: spec.template.spec.containers[0].workingDir %s: %s\n",
                l->o.file, wd, strerror(errno));
        return EDL_EXIT_USAGE;
    }
    say("trainers start in %s (workingDir)", wd);
    return 0;
}

/* This machine's state of the job: the state directory must be usable (edl status, scale and
 * stop find the job there) and no other launcher may run the job here (they would share its
 * state file); what a launcher that died left is taken over. 0 or an exit code. */
static int claim_state(launcher *l)
{
    char why[700];
    long stale = 0;
    if (cli_state_check(why, sizeof why) != 0 ||
        cli_state_lock(l->o.job, &l->lock_fd, &stale, why, sizeof why) != 0) {
        fprintf(stderr, "edl run: %s\n", why);
        return EDL_EXIT_USAGE;
    }
    if (stale) {
        say("taking over the state of job %s that a launcher which is gone (pid %ld) left here",
            l->o.job, stale);
        cli_state_clean_stale(l->o.job, stale);
    }
    int rc = cli_state_scratch_dir(l->o.job, l->scratch, sizeof l->scratch, why, sizeof why);
    if (rc) {
        l->scratch[0] = '\0';
        fprintf(stderr, "edl run: %s\n", why);
        return EDL_EXIT_USAGE;
    }
    if (cli_logs_dir(l->o.job, true, l->log_dir, sizeof l->log_dir, why, sizeof why) != 0 ||
        (cli_logs_reset(l->log_dir) != 0 &&
         snprintf(why, sizeof why, "cannot empty %s: %s", l->log_dir, strerror(errno)))) {
        say("warning: no log files for edl logs: %s", why);
        l->log_dir[0] = '\0';
    } else {
        say("logs by pod and rank in %s (edl logs %s [--rank N])", l->log_dir, l->o.job);
    }
    return 0;
}

/* The job's etcd and everything it needs, then the job: the exit code. */
static int run_all(launcher *l, bool *wrote_state)
{
    int ret = claim_state(l);
    if (!ret)
        ret = enter_working_dir(l);
    if (!ret)
        ret = prepare_secret(l); /* before the children's environment, which names it */
    if (!ret)
        ret = open_etcd(l);
    if (!ret)
        ret = run_job(l, wrote_state);
    return ret;
}

/* Stop what is left in order (agents, then the job server, then etcd: each needs the next
 * while it leaves), say how the job ended as the last line, and clean up. */
static void finish(launcher *l, bool wrote_state, int ret)
{
    shutdown_rest(l);
    if (l->w)
        edl_watch_close(l->w);
    if (l->ran) /* a failure's cause last, where people look first */
        say("job %s %s after %.1f s: generation %lld, exit code %d%s%s", l->o.job,
            l->interrupted ? "interrupted" : edl_job_state_name(l->state),
            (double)(edl_monotonic_ms() - l->started_ms) / 1000.0, (long long)l->gen, ret,
            l->failed_why[0] && !l->interrupted ? ": " : "",
            l->interrupted ? "" : l->failed_why);
    if (wrote_state)
        cli_state_remove(l->o.job);
    if (l->secret[0])
        cli_state_drop_secret(l->secret);
    edl_etcd_close(l->c);
    edl_etcd_server_close(l->srv);
    if (l->tls_dir[0])
        cli_state_tls_remove(l->tls_dir);
    if (l->scratch[0])
        cli_state_scratch_remove(l->scratch);
    cli_state_unlock(l->o.job, l->lock_fd);
}

static void free_opts(launcher *l)
{
    edl_etcd_config_clear(&l->cfg);
    edl_etcd_config_clear(&l->o.etcd);
    edl_env_free(l->child_env);
    edl_spec_clear(&l->o.spec);
    edl_job_keys_clear(&l->k);
    cli_manifest_clear(&l->o.m);
}

int cli_run(int argc, char **argv)
{
    launcher l = {.js = {.out = -1, .log_fd = -1}, .gen = -1, .state = EDL_JOB_WAITING, .lock_fd = -1};
    edl_etcd_config_init(&l.o.etcd);
    edl_etcd_config_init(&l.cfg);
    if (parse_run(argc, argv, &l.o) != 0 || edl_job_keys_init(&l.k, l.o.prefix, l.o.job) != 0) {
        free_opts(&l);
        return EDL_EXIT_USAGE; /* parse_run checked the name and prefix the keys are made of */
    }
    l.desired[ROLE_W] = edl_spec_desired_pods(&l.o.spec);
    l.desired[ROLE_PS] = edl_spec_desired_servers(&l.o.spec);
    l.desired[ROLE_T] = edl_spec_desired_teachers(&l.o.spec);
    l.started_ms = edl_monotonic_ms();
    find_bin("EDL_AGENT_BIN", "edl-agent", l.agent_bin, sizeof l.agent_bin);
    find_bin("EDL_JOBSERVER_BIN", "edl-jobserver", l.js_bin, sizeof l.js_bin);
    if (open_loop(&l) != 0) {
        fprintf(stderr, "edl run: cannot set up its loop (signalfd: %s)\n", strerror(errno));
        edl_loop_free(l.loop);
        free_opts(&l);
        return EDL_EXIT_FAILED;
    }
    bool wrote_state = false;
    int ret = run_all(&l, &wrote_state);
    finish(&l, wrote_state, ret);
    free_opts(&l);
    edl_loop_free(l.loop);
    return ret;
}
