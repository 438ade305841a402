/* agent.c: the agent's start-up and its single-threaded loop (edl/loop.h).
 *
 * The loop waits on a signalfd, the lease keeper's fd, the generation watch, the trainer's pipes,
 * the metrics server and a few timers. After anything happens, agent_reconcile() compares what
 * is (the trainer process, its generation) with what the latest generation asks for, and
 * acts: start, stop, restart, or tell an in-process trainer of a new generation. The agent
 * never restarts a trainer on its own: after an exit it reports and waits for the job server's
 * next generation. A generation that changed only the servers keeps a worker's trainer as it
 * is. With --role ps the process is a parameter server: started when the pod is listed in
 * `servers`, never restarted for a later generation (it follows them itself through etcd),
 * left running when the pod leaves the servers (it drains and exits 0: the agent then leaves
 * too). With --role teacher the process is an inference server, started at once and kept in
 * the service while healthy (teacher.c); it needs no generation, but ends with the job. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "edl/log.h"

extern char **environ;

/* ---- start-up ------------------------------------------------------------------------------ */

static void ignore_fd(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events, (void)arg; /* woken: the caller reads what came */
}

/* One wait of start-up on the loop (its signals, the metrics server, the spec's watch w):
 * 128+signal when a leave was asked for, else 0. */
static int startup_wait(agent *a, edl_watch *w, int timeout_ms)
{
    int wfd = w ? edl_watch_fd(w) : -1;
    if (wfd >= 0)
        edl_loop_fd_add(a->loop, wfd, EDL_LOOP_READ, ignore_fd, NULL);
    edl_loop_turn(a->loop, timeout_ms);
    if (wfd >= 0)
        edl_loop_fd_del(a->loop, wfd);
    return a->leaving_signal ? 128 + a->leaving_signal : 0;
}

/* Parse and adopt the spec; EDL_EXIT_USAGE when it is invalid. */
static int take_spec(agent *a, const edl_kv *kv)
{
    char err[256];
    edl_job_spec s;
    edl_spec_init(&s);
    if (edl_spec_parse(kv->value, kv->value_len, &s, err, sizeof err) != 0) {
        EDL_ERROR("agent", "%s is invalid: %s; fix the job's spec", a->keys.spec, err);
        edl_spec_clear(&s);
        return EDL_EXIT_USAGE;
    }
    edl_spec_clear(&a->spec);
    a->spec = s;
    return 0;
}

/* Read the job's spec, waiting for etcd (up to the start-up timeout) and for the spec to be
 * written (indefinitely, watching it). Returns 0 or an exit code. */
static int wait_for_spec(agent *a)
{
    int64_t deadline = edl_monotonic_ms() + a->o->startup_timeout_ms, next_note = 0;
    bool noted_absent = false, reached = false;
    edl_watch *w = NULL;
    for (;;) {
        edl_kv *kv = NULL;
        int64_t rev = 0;
        int rc = edl_etcd_get(a->etcd, edl_str(a->keys.spec), &kv, &rev);
        if (rc == 0) {
            edl_watch_close(w);
            rc = take_spec(a, kv);
            edl_kv_free(kv);
            return rc;
        }
        int sig;
        if (rc == EDL_ENOTFOUND) {
            reached = true;
            if (!noted_absent)
                EDL_INFO("agent", "%s does not exist yet: waiting for it", a->keys.spec);
            noted_absent = true;
            edl_watch_opts wo = {.start_revision = rev + 1};
            if (!w && edl_watch_open(a->etcd, edl_str(a->keys.spec), &wo, &w) != 0)
                w = NULL;
            if ((sig = startup_wait(a, w, w ? 5000 : 1000)) != 0) {
                edl_watch_close(w);
                return sig;
            }
            edl_watch_event *ev;
            while (w && edl_watch_next(w, &ev, 0) == 0) {
                bool dead = ev->type == EDL_WATCH_ERROR;
                edl_watch_event_free(ev);
                if (dead) {
                    edl_watch_close(w);
                    w = NULL;
                }
            }
            continue;
        }
        if (rc == EDL_EAUTH) { /* waiting will not change the answer */
            EDL_ERROR("agent", "%s; %s", edl_etcd_errmsg(a->etcd), edl_etcd_advice(rc));
            edl_watch_close(w);
            return EDL_EXIT_UNREACHABLE;
        }
        if (!reached && edl_monotonic_ms() >= deadline) {
            EDL_ERROR("agent", "etcd unreachable for %lld s at start-up: %s; %s",
                      (long long)(a->o->startup_timeout_ms / 1000), edl_etcd_errmsg(a->etcd),
                      edl_etcd_advice(rc));
            edl_watch_close(w);
            return EDL_EXIT_UNREACHABLE;
        }
        if (edl_monotonic_ms() >= next_note) {
            EDL_WARN("agent", "etcd not reachable yet (%s); retrying for %lld s more",
                     edl_etcd_errmsg(a->etcd), (long long)((deadline - edl_monotonic_ms()) / 1000));
            next_note = edl_monotonic_ms() + 5000;
        }
        if ((sig = startup_wait(a, NULL, 500)) != 0) {
            edl_watch_close(w);
            return sig;
        }
    }
}

/* ---- the spec, read again before each trainer start --------------------------------------- */

/* A read of the job's spec on the etcd worker (registry_call) for one start: the start's number
 * and the generation it was asked in. */
typedef struct spec_read {
    char *key;
    edl_kv *kv;
    int64_t start, gen;
} spec_read;

static int spec_read_run(edl_etcd *etcd, void *arg)
{
    spec_read *r = arg;
    return edl_etcd_get(etcd, edl_str(r->key), &r->kv, NULL);
}

static void spec_read_done(agent *a, void *arg, int rc, const char *err)
{
    spec_read *r = arg;
    a->spec_busy = false;
    a->spec_start = r->start;
    a->spec_gen = r->gen;
    if (rc == 0) {
        take_spec(a, r->kv); /* an invalid one is said there and the cached one kept */
    } else {
        a->m.etcd_errors++;
        EDL_WARN("agent", "reading %s before the trainer's start: %s; starting with the spec "
                 "read before", a->keys.spec, err);
    }
    edl_kv_free(r->kv);
    free(r->key);
    free(r);
}

static int64_t generation_now(const agent *a)
{
    return a->have_generation ? a->generation.generation : 0;
}

/* The trainer's next start gets the job's current spec: true once the read asked for this start
 * (in this generation) has come back, whatever it found (the cached spec stays when etcd cannot
 * be read or the new one is invalid). Else the read is on its way on the etcd worker, and its
 * answer wakes the loop, whose reconcile asks again. */
static bool spec_read_for_start(agent *a)
{
    int64_t start = a->starts + 1, gen = generation_now(a);
    if (a->spec_start == start && a->spec_gen == gen)
        return true;
    if (a->spec_busy)
        return false;
    spec_read *r = calloc(1, sizeof *r);
    if (r && (r->key = strdup(a->keys.spec))) {
        r->start = start;
        r->gen = gen;
        if (registry_call(a, spec_read_run, spec_read_done, r) == 0) {
            a->spec_busy = true;
            return false;
        }
    }
    if (r)
        free(r->key);
    free(r);
    EDL_WARN("agent", "cannot ask etcd for %s: starting with the spec read before", a->keys.spec);
    return true;
}

/* ---- the trainer ------------------------------------------------------------------------------ */

/* Publish the trainer's state, with a message for people ("" or NULL: none); own: the
 * trainer's error file marked its failure as the script's own (edl_pod_status.own_error). */
static void set_status_own(agent *a, edl_trainer_state st, int64_t gen, int code, int sig,
                           const char *msg, bool own)
{
    bool live = st == EDL_TRAINER_RUNNING || st == EDL_TRAINER_HUNG;
    edl_pod_status s = {.generation = gen, .state = st, .exit_code = code, .signal = sig,
                        .pid = live ? a->tp.pid : 0, .own_error = own,
                        .inprocess = a->inprocess,
                        .step = a->tp.step, .restarts = a->starts > 0 ? a->starts - 1 : 0,
                        .total_steps = a->tp.total};
    snprintf(s.message, sizeof s.message, "%s", msg ? msg : "");
    registry_status_set(a, &s);
}

static void set_status_msg(agent *a, edl_trainer_state st, int64_t gen, int code, int sig,
                           const char *msg)
{
    set_status_own(a, st, gen, code, sig, msg, false);
}

static void set_status(agent *a, edl_trainer_state st, int64_t gen, int code, int sig)
{
    set_status_msg(a, st, gen, code, sig, NULL);
}

/* When a running trainer's wait in a collective passes the job's progress timeout (0: never). */
static int64_t hang_due_ms(const agent *a)
{
    if (!trainer_running(&a->tp) || a->tp.stopping || !a->tp.blocked_since_ms ||
        a->spec.progress_timeout_ms <= 0 || a->status.state != EDL_TRAINER_RUNNING ||
        a->status.generation != a->run_gen)
        return 0;
    return a->tp.blocked_since_ms + a->spec.progress_timeout_ms;
}

/* A trainer blocked in one collective for longer than the progress timeout is hung (its peers
 * may be too: in synchronous training everyone waits, so "nobody advances" alone proves
 * nothing). The state sticks until the trainer exits or is re-formed; the job server restarts
 * the generation. */
static void check_hung(agent *a)
{
    int64_t due = hang_due_ms(a), now = edl_monotonic_ms();
    if (!due || now < due)
        return;
    char msg[EDL_STATUS_MESSAGE_MAX];
    snprintf(msg, sizeof msg, "blocked for %lld ms (progress timeout %lld ms) in %s",
             (long long)(now - a->tp.blocked_since_ms), (long long)a->spec.progress_timeout_ms,
             a->tp.blocked_what[0] ? a->tp.blocked_what : "a collective");
    EDL_WARN("agent", "generation %lld: trainer %d hung: %s", (long long)a->run_gen,
             (int)a->tp.pid, msg);
    set_status_msg(a, EDL_TRAINER_HUNG, a->run_gen, 0, 0, msg);
}

static void send_generation(agent *a, int rank)
{
    edl_assignment g;
    if (agent_assignment(&a->generation, rank, a->master_port, &g) != 0)
        return;
    char *line = edl_assignment_encode(&g);
    if (line)
        trainer_send_control(&a->tp, line);
    free(line);
}

/* The pod leaves the job (scaled down, told to leave by a signal): an in-process trainer that
 * said "graceful" is told to stop at its next commit, where its peers move to leave_gen (the
 * first generation without this pod) or later, and to exit 0; SIGTERM follows only after the
 * grace period. Any other trainer gets SIGTERM now. */
static void leave_or_stop(agent *a, int64_t leave_gen)
{
    if (!trainer_running(&a->tp) || a->tp.stopping)
        return;
    if (a->tp.graceful && !a->ahead && a->spec.mode == EDL_MODE_INPROCESS) {
        edl_assignment g = {.generation = leave_gen, .leave = true};
        char *line = edl_assignment_encode(&g);
        int rc = line ? trainer_leave(&a->tp, line, a->o->grace_ms) : EDL_ENOMEM;
        free(line);
        if (rc == 0) {
            EDL_INFO("agent", "generation %lld: the trainer leaves at its next commit (SIGTERM "
                     "in %lld ms if it does not)", (long long)leave_gen,
                     (long long)a->o->grace_ms);
            return;
        }
    }
    trainer_stop(&a->tp, a->o->grace_ms);
}

/* The latest generation keeps the workers of the one the trainer was started or re-formed for
 * (the job server kept members_generation): only the servers changed, so it keeps the trainer,
 * its environment and its rendezvous. */
static bool only_servers_changed(const agent *a)
{
    return a->run_members_gen > 0 &&
           edl_generation_of_members(&a->generation) == a->run_members_gen;
}

/* Spawn the trainer with its pipes and environment (rank < 0: no assignment yet); 0, or the
 * code with the reason in err. */
static int spawn_trainer(agent *a, int rank, char *err, size_t errlen)
{
    int child_ctl, child_prog, child_err;
    char **env = NULL;
    int rc = trainer_pipes(&a->tp, &child_ctl, &child_prog, &child_err);
    if (rc == 0) {
        agent_env_input in = {.job = a->o->job, .pod = a->o->pod, .etcd = &a->o->etcd,
                              .prefix = a->o->prefix, .role = a->o->role, .spec = &a->spec,
                              .generation = &a->generation, .rank = rank,
                              .master_port = a->master_port,
                              .error_file = a->error_file[0] ? a->error_file : NULL, /* not ps */
                              .control_fd = AGENT_CONTROL_FD, .progress_fd = AGENT_PROGRESS_FD};
        if (a->error_file[0])
            unlink(a->error_file); /* what a failure writes there is this start's */
        rc = agent_env_build(&in, environ, &env);
        if (rc) {
            close(child_ctl);
            close(child_prog);
            close(child_err);
        } else {
            rc = trainer_spawn(&a->tp, a->o->argv, env, child_ctl, child_prog, child_err, err,
                               errlen);
        }
        edl_env_free(env);
    }
    a->starts++;
    if (rc && !err[0])
        snprintf(err, errlen, "%s", edl_strerror(rc));
    return rc;
}

static void start_trainer(agent *a, int rank)
{
    int64_t gen = a->generation.generation;
    a->started_gen = gen; /* once per generation, whatever happens next */
    char err[EDL_STATUS_MESSAGE_MAX] = "";
    int rc = spawn_trainer(a, rank, err, sizeof err);
    if (rc) {
        /* 127 and the reason: the job server fails the job (reconcile.c, cannot_start) */
        EDL_ERROR("agent", "generation %lld: the trainer could not be started: %s",
                  (long long)gen, err);
        a->tp.step = -1;
        set_status_msg(a, EDL_TRAINER_EXITED, gen, 127, 0, err);
        return;
    }
    a->run_gen = gen;
    a->run_rank = rank;
    if (a->ps) { /* no control line: a server follows the generations through etcd */
        EDL_INFO("agent", "generation %lld: parameter server %d started as server %d of %zu "
                 "(start %lld)", (long long)gen, (int)a->tp.pid, rank,
                 a->generation.n_servers, (long long)a->starts);
    } else {
        EDL_INFO("agent", "generation %lld: trainer %d started as rank %d of %zu (start %lld)",
                 (long long)gen, (int)a->tp.pid, rank, a->generation.n_members,
                 (long long)a->starts);
        a->run_members_gen = edl_generation_of_members(&a->generation);
        send_generation(a, rank);
    }
    set_status(a, EDL_TRAINER_RUNNING, gen, 0, 0);
}

#define AHEAD_READY_S 5 /* the longest a pod waits for its trainer started ahead to be ready (one
                         * that does not speak "ready" delays its pod's first registration so) */

/* In InProcess mode a worker pod's trainer starts ahead of the pod's membership, when the agent
 * starts (and again while the pod waits as a standby): it loads its interpreter and framework,
 * says "ready" on its progress pipe and waits for its first assignment on the control pipe
 * (edl.torch and libedlcoll do). The pod registers only then, so a pod joining costs the
 * members no start-up, only the re-formation. Its status stays waiting meanwhile. One that
 * ends before its pod is a member is not started ahead again: the pod's ordinary start follows
 * when it is a member. */
static void start_ahead(agent *a)
{
    char err[EDL_STATUS_MESSAGE_MAX] = "";
    if (spawn_trainer(a, -1, err, sizeof err) != 0) {
        EDL_WARN("agent", "the trainer could not be started ahead of membership: %s; it starts "
                 "when the pod is a member", err);
        a->ahead_failed = true;
        return;
    }
    a->ahead = true;
    a->ahead_since_ms = edl_monotonic_ms();
    a->run_gen = 0;
    a->run_rank = -1;
    EDL_INFO("agent", "trainer %d started ahead of membership: it waits for its first "
             "assignment", (int)a->tp.pid);
}

/* The pod joins once the trainer started ahead is ready (or ended, or took too long: then the
 * ordinary start follows when the pod is a member). */
static void register_started_ahead(agent *a, int64_t now)
{
    if (a->ahead && !a->tp.ready)
        EDL_WARN("agent", "the trainer started ahead of membership did not say it was ready "
                 "within %d s: registering the pod anyway", AHEAD_READY_S);
    else if (a->ahead)
        EDL_INFO("agent", "the trainer started ahead is ready (%lld ms): registering the pod",
                 (long long)(now - (a->ahead_register_ms - AHEAD_READY_S * 1000)));
    a->ahead_register_ms = 0;
    if (!a->leaving_signal && a->final_exit < 0)
        registry_register(a);
}

/* This pod's trainers re-form in process: the spec says so, or (the mode not given) one of
 * them said so ("inprocess" on its progress pipe). The explicit mode wins either way. */
static bool in_process(const agent *a)
{
    return a->spec.mode == EDL_MODE_INPROCESS || (a->spec.mode == EDL_MODE_AUTO && a->inprocess);
}

/* The running trainer takes a new generation over its control pipe: the spec says trainers
 * re-form in process, or (the mode not given) this one said it does, or it was started ahead
 * (for a trainer that re-forms in process) and waits for its first assignment. */
static bool reforms_running(const agent *a)
{
    return a->spec.mode == EDL_MODE_INPROCESS ||
           (a->spec.mode == EDL_MODE_AUTO && (a->tp.inprocess || a->ahead));
}

/* The trainer said "inprocess": with the mode not given, the pod re-forms in process from now
 * on (and says so in its status, for the job server). */
static void took_inprocess(agent *a)
{
    if (!a->tp.inprocess || a->inprocess)
        return;
    a->inprocess = true;
    EDL_INFO("agent", "the trainer re-forms in process (it said so)%s", a->spec.mode ==
             EDL_MODE_AUTO ? ": new generations reach it over its control pipe" :
             a->spec.mode == EDL_MODE_RESTART ? ", but the job's elastic mode is restart: it is "
             "restarted on every change" : "");
}

/* A worker of an InProcess job without parameter servers (a Fleet trainer reads its servers
 * from the environment it starts with, which one started ahead would not have). */
static bool ahead_kind(const agent *a)
{
    return !a->ps && !a->teacher && a->o->job && in_process(a) && a->spec.ps_max == 0;
}

static bool ahead_at_start(const agent *a)
{
    return ahead_kind(a) && !a->spec.stopped;
}

static bool ahead_due(const agent *a)
{
    return ahead_kind(a) && !a->ahead && !a->ahead_failed && a->have_generation &&
           !edl_job_state_final(a->generation.state) && !a->leaving_signal;
}

/* "last stderr: <line> | <line>" from the trainer's last stderr lines ("" : none). */
static void stderr_message(const agent *a, char *msg, size_t len)
{
    char tail[TRAINER_TAIL_LINES * 240 + 16];
    trainer_stderr_tail(&a->tp, tail, sizeof tail);
    if (tail[0])
        snprintf(msg, len, "last stderr: %s", tail);
}

static void on_trainer_exit(agent *a, int wstatus, bool by_agent)
{
    int64_t gen = a->run_gen;
    a->run_gen = 0;
    if (a->ahead) { /* never a member: nothing for the job server to judge */
        a->ahead = false;
        a->ahead_failed = !by_agent;
        if (by_agent)
            EDL_INFO("agent", "the trainer started ahead of membership stopped");
        else
            EDL_WARN("agent", "the trainer started ahead of membership ended (%s %d) before the "
                     "pod was a member; it starts again when it is one",
                     WIFEXITED(wstatus) ? "exit code" : "signal",
                     WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : WTERMSIG(wstatus));
        return;
    }
    if (by_agent) {
        EDL_INFO("agent", "trainer of generation %lld stopped", (long long)gen);
        set_status(a, EDL_TRAINER_STOPPED, gen, 0, 0);
        return;
    }
    char msg[EDL_STATUS_MESSAGE_MAX] = "";
    bool own = false;
    if (a->error_file[0] && agent_read_error_file(a->error_file, msg, sizeof msg, &own) == 0)
        EDL_WARN("agent", "trainer of generation %lld failed%s: %s", (long long)gen,
                 own ? " (the script's own error, it says)" : "", msg);
    else /* no error file: what it said last on stderr (a traceback ends with the exception) */
        stderr_message(a, msg, sizeof msg);
    if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0 && a->ps) {
        /* it handed its shards over (or was told to drain): the pod leaves the job */
        EDL_INFO("agent", "parameter server of generation %lld exited with code 0: a clean "
                 "leave; the agent leaves too", (long long)gen);
        set_status(a, EDL_TRAINER_EXITED, gen, 0, 0);
        a->final_exit = EDL_EXIT_SUCCEEDED;
    } else if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) {
        EDL_INFO("agent", "trainer of generation %lld exited with code 0", (long long)gen);
        set_status(a, EDL_TRAINER_EXITED, gen, 0, 0);
    } else if (WIFEXITED(wstatus)) {
        EDL_INFO("agent", "trainer of generation %lld exited with code %d; waiting for the job "
                 "server's decision", (long long)gen, WEXITSTATUS(wstatus));
        set_status_own(a, EDL_TRAINER_EXITED, gen, WEXITSTATUS(wstatus), 0, msg, own);
    } else {
        EDL_WARN("agent", "trainer of generation %lld killed by signal %d; waiting for the job "
                 "server's decision", (long long)gen, WTERMSIG(wstatus));
        set_status_msg(a, EDL_TRAINER_SIGNALED, gen, 0, WTERMSIG(wstatus), msg);
    }
}

const edl_member *agent_member(const agent *a)
{
    if (a->ps || !a->have_generation || a->generation.state != EDL_JOB_RUNNING || !a->keeper)
        return NULL;
    return edl_generation_member(&a->generation, a->o->pod, a->lease);
}

const edl_member *agent_server(const agent *a)
{
    if (!a->ps || !a->have_generation || edl_job_state_final(a->generation.state) || !a->keeper)
        return NULL;
    return edl_generation_server(&a->generation, a->o->pod, a->lease);
}

/* The generation's MASTER_PORT is known (registry_master_port); else look again in 50 ms. */
static bool master_known(agent *a, int rank)
{
    if (registry_master_port(a, rank) == 0) {
        a->master_retry_ms = 0;
        return true;
    }
    a->master_retry_ms = edl_monotonic_ms() + 50;
    return false;
}

/* Only the servers changed: the trainer serves the new generation as it is (no restart, no
 * control line); its status (running, or how it ended) is reported for it, so the job server
 * judges the workers in the generation it published. */
static void carry_to(agent *a, int64_t gen)
{
    EDL_INFO("agent", "generation %lld changed only the servers: the trainer of generation %lld "
             "%s", (long long)gen, (long long)a->started_gen,
             trainer_running(&a->tp) ? "keeps running" : "stays as it ended");
    if (trainer_running(&a->tp))
        a->run_gen = gen;
    a->started_gen = gen;
    edl_pod_status s = a->status;
    s.generation = gen;
    registry_status_set(a, &s);
}

/* A pod that is no member reports "waiting" for the current generation. With a trainer started
 * ahead (or about to be), only once it is ready (or AHEAD_READY_S passed: the loop wakes at
 * least every second). After an in-process trainer failed, that report is what makes the pod a
 * candidate again (reconcile.c, awaiting_replacement), so it joins when its trainer can take
 * part at once. */
static void report_waiting(agent *a, int64_t gen)
{
    if (ahead_due(a) && !trainer_running(&a->tp))
        return; /* its start ahead waits for the spec's read */
    if (a->ahead && !a->tp.ready &&
        edl_monotonic_ms() < a->ahead_since_ms + AHEAD_READY_S * 1000)
        return;
    if (a->status.state != EDL_TRAINER_WAITING || a->status.generation != gen) {
        a->tp.step = -1;
        set_status(a, EDL_TRAINER_WAITING, gen, 0, 0);
    }
}

/* The trainer of the last start ended by itself (its status says how). */
static bool trainer_ended(const agent *a)
{
    return a->status.generation == a->started_gen &&
           (a->status.state == EDL_TRAINER_EXITED || a->status.state == EDL_TRAINER_SIGNALED);
}

static void reconcile_worker(agent *a)
{
    const edl_member *m = agent_member(a);
    int64_t gen = generation_now(a);
    if (trainer_running(&a->tp)) {
        if (a->tp.stopping || (m && gen == a->run_gen))
            return;
        if (!m && a->ahead && !edl_job_state_final(a->generation.state)) {
            report_waiting(a, gen); /* started ahead: still waiting to be a member */
            return;
        }
        if (m && gen > a->run_gen && !a->ahead && only_servers_changed(a)) {
            carry_to(a, gen);
            return;
        }
        /* In process mode the trainer keeps running whatever its new rank: it learns the rank
         * from the control line (its environment keeps the values it started with). */
        if (m && gen > a->run_gen && reforms_running(a) && a->tp.control_fd >= 0) {
            if (!master_known(a, m->rank))
                return;
            if (a->ahead)
                EDL_INFO("agent", "generation %lld: the trainer started ahead joins as rank %d",
                         (long long)gen, m->rank);
            else
                EDL_INFO("agent", "generation %lld: re-forming in process as rank %d (was %d)",
                         (long long)gen, m->rank, a->run_rank);
            a->ahead = false;
            a->run_gen = gen;
            a->started_gen = gen; /* this generation has its trainer: no second start on exit */
            a->run_rank = m->rank;
            a->run_members_gen = edl_generation_of_members(&a->generation);
            send_generation(a, m->rank);
            set_status(a, EDL_TRAINER_RUNNING, gen, 0, 0);
            return;
        }
        if (m) {
            EDL_INFO("agent", "generation %lld: restarting the trainer (rank %d -> %d)",
                     (long long)gen, a->run_rank, m->rank);
            trainer_stop(&a->tp, a->o->grace_ms);
            return;
        }
        EDL_INFO("agent", "generation %lld (%s): this pod is not a member; stopping the trainer",
                 (long long)gen, edl_job_state_name(a->generation.state));
        leave_or_stop(a, gen);
        return;
    }
    if (m && gen > a->started_gen) {
        if (only_servers_changed(a) && trainer_ended(a))
            carry_to(a, gen); /* done (or failed) already: the job server decides */
        else if (master_known(a, m->rank) && spec_read_for_start(a))
            start_trainer(a, m->rank);
        return;
    }
    if (!m && ahead_due(a) && spec_read_for_start(a))
        start_ahead(a);
    if (!m)
        report_waiting(a, gen);
}

/* A parameter server holds state: it starts when the pod is listed in `servers` and is never
 * restarted for a later generation while it stays listed; unlisted, it keeps running (it
 * drains and exits by itself). After its process failed the pod waits to be listed again. */
static void reconcile_server(agent *a)
{
    const edl_member *s = agent_server(a);
    int64_t gen = generation_now(a);
    if (trainer_running(&a->tp)) {
        if (a->tp.stopping || gen <= a->run_gen)
            return;
        if (s) {
            a->run_gen = a->started_gen = gen;
            a->run_rank = s->rank;
            set_status(a, EDL_TRAINER_RUNNING, gen, 0, 0);
        } else if (a->noted_gen != gen) {
            a->noted_gen = gen;
            EDL_INFO("agent", "generation %lld: this pod is no server now; its process keeps "
                     "running until it exits by itself", (long long)gen);
        }
        return;
    }
    if (s && gen > a->started_gen) {
        if (spec_read_for_start(a))
            start_trainer(a, s->rank);
        return;
    }
    if (!s && (a->status.state != EDL_TRAINER_WAITING || a->status.generation != gen)) {
        a->tp.step = -1;
        set_status(a, EDL_TRAINER_WAITING, gen, 0, 0);
    }
}

/* A final job state as a teacher's exit code: it served until the end, whatever the students'
 * result (0), unless the job was stopped (as every agent then). */
static int teacher_exit_code(edl_job_state s)
{
    return s == EDL_JOB_STOPPED ? EDL_EXIT_STOPPED : EDL_EXIT_SUCCEEDED;
}

void agent_reconcile(agent *a)
{
    if (a->leaving_signal && !a->teacher && a->final_exit < 0) {
        leave_or_stop(a, a->run_gen + 1); /* the job server publishes one without this pod */
        return;
    }
    if (a->leaving_signal || a->final_exit >= 0) {
        if (!a->teacher || teacher_leave_ready(a)) /* the key first, then the server */
            trainer_stop(&a->tp, a->o->grace_ms);
        return;
    }
    if (a->have_generation && edl_job_state_final(a->generation.state)) {
        EDL_INFO("agent", "job %s %s (generation %lld): leaving", a->o->job,
                 edl_job_state_name(a->generation.state), (long long)a->generation.generation);
        a->final_exit = a->teacher ? teacher_exit_code(a->generation.state)
                                   : edl_job_exit_code(a->generation.state);
        if (!a->teacher || teacher_leave_ready(a))
            trainer_stop(&a->tp, a->o->grace_ms);
        return;
    }
    if (a->teacher) { /* a stateless server: kept running through a lost lease */
        teacher_reconcile(a);
        return;
    }
    if (!a->keeper) { /* no lease: this pod is no member or server of anything */
        if (!a->ahead_register_ms && !a->reg_busy) /* (a trainer started ahead waits for its
                                                    * registration, due or on its way) */
            trainer_stop(&a->tp, a->o->grace_ms);
        return;
    }
    if (a->ps)
        reconcile_server(a);
    else
        reconcile_worker(a);
}

/* ---- the loop -------------------------------------------------------------------------------- */

static void on_signal(edl_loop *l, int sig, void *arg)
{
    (void)l;
    agent *a = arg;
    if (!a->looping) { /* start-up (wait_for_spec) ends on it */
        if ((sig == SIGTERM || sig == SIGINT) && !a->leaving_signal) {
            EDL_INFO("agent", "signal %d during start-up: leaving", sig);
            a->leaving_signal = sig;
        }
        return;
    }
    if (sig == SIGTERM || sig == SIGINT) {
        if (a->leaving_signal) {
            EDL_WARN("agent", "signal %d again: killing the trainer now", sig);
            trainer_kill(&a->tp);
            return;
        }
        EDL_INFO("agent", "signal %d: stopping the trainer and leaving the job", sig);
        a->leaving_signal = sig;
        bool stop = !a->teacher || teacher_leave_ready(a); /* students stop asking first */
        registry_unregister(a); /* the job server sees the leave now, not after the TTL */
        if (stop) /* else once the record is gone (agent_reconcile) */
            agent_reconcile(a);
    } else if (sig == SIGHUP) {
        EDL_INFO("agent", "SIGHUP ignored");
    }
    /* SIGCHLD: the loop reaps after every wake-up */
}

/* The agent's signals, blocked before any thread exists (keeper, watch), so every thread
 * inherits the mask and the signals wait for the loop's signalfd. */
static int take_signals(agent *a)
{
    signal(SIGPIPE, SIG_IGN); /* a trainer closing its control pipe must not kill the agent */
    return edl_loop_signals(a->loop, EDL_SIGNALS_STOP | EDL_SIGNALS_CHILD | EDL_SIGNALS_HUP,
                            on_signal, a);
}

static int keeper_fd(void *arg, int *events)
{
    (void)events;
    agent *a = arg;
    return a->keeper ? edl_lease_keeper_fd(a->keeper) : -1;
}

static void on_keeper(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events;
    agent *a = arg;
    if (a->keeper && edl_lease_keeper_status(a->keeper) != 0)
        registry_lease_lost(a);
}

static int watch_fd(void *arg, int *events)
{
    (void)events;
    agent *a = arg;
    return a->watch ? edl_watch_fd(a->watch) : -1;
}

static void on_watch(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events;
    agent *a = arg;
    if (a->watch)
        registry_watch_events(a);
}

static int progress_fd(void *arg, int *events)
{
    (void)events;
    return ((agent *)arg)->tp.progress_fd;
}

static void on_progress(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events;
    agent *a = arg;
    if (!trainer_read_progress(&a->tp))
        return;
    took_inprocess(a);
    if (trainer_running(&a->tp) && a->status.state == EDL_TRAINER_RUNNING) {
        agent_metrics_progress(a);
        set_status(a, EDL_TRAINER_RUNNING, a->run_gen, 0, 0);
    }
}

/* The trainer's stderr pipe, while its relay has room. */
static int stderr_fd(void *arg, int *events)
{
    (void)events;
    const trainer_proc *t = &((agent *)arg)->tp;
    return t->relay && stderr_relay_full(t->relay) ? -1 : t->stderr_fd;
}

static void on_stderr(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events;
    trainer_read_stderr(&((agent *)arg)->tp, false);
}

/* The control pipe, while a line waits to be written. */
static int control_fd(void *arg, int *events)
{
    agent *a = arg;
    *events = EDL_LOOP_WRITE;
    return a->tp.ctl_len ? a->tp.control_fd : -1;
}

static void on_control(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd, (void)events;
    trainer_flush_control(&((agent *)arg)->tp);
}

static int health_fd(void *arg, int *events)
{
    return teacher_fd(arg, events);
}

static void on_health(edl_loop *l, int fd, int events, void *arg)
{
    (void)l, (void)fd;
    teacher_on_poll(arg, events);
}

/* ---- the loop's timers: each due time is kept where it is decided; these act on it ---------- */

static int64_t hang_due(void *arg)
{
    return hang_due_ms(arg);
}

static void on_hang_due(edl_loop *l, void *arg)
{
    (void)l;
    check_hung(arg);
}

/* The grace period's next step (SIGTERM, then SIGKILL) of a trainer told to stop. */
static int64_t stop_due(void *arg)
{
    const trainer_proc *t = &((agent *)arg)->tp;
    if (t->pid <= 0 || !t->stopping || !t->kill_at_ms)
        return 0;
    return t->term_at_ms ? t->term_at_ms : t->kill_at_ms;
}

static void on_stop_due(edl_loop *l, void *arg)
{
    (void)l;
    trainer_tick(&((agent *)arg)->tp);
}

static void on_watch_due(edl_loop *l, void *arg)
{
    (void)l;
    registry_watch_open(arg);
}

/* The next registration attempt, once no trainer of the lost lease runs any more (its exit
 * wakes the loop) and the pod is not leaving. */
static int64_t register_due(void *arg)
{
    agent *a = arg;
    if ((trainer_running(&a->tp) && !a->teacher) || a->leaving_signal || a->final_exit >= 0 ||
        a->reg_busy || a->keeper)
        return 0;
    return a->reg_next_ms;
}

static void on_register_due(edl_loop *l, void *arg)
{
    (void)l;
    registry_register(arg);
}

/* A trainer started ahead: register once it is ready, or ended, or at ahead_register_ms. */
static void register_ahead_when_ready(edl_loop *l, void *arg)
{
    (void)l;
    agent *a = arg;
    int64_t now = edl_monotonic_ms();
    if (a->ahead_register_ms && (a->tp.ready || !a->ahead || now >= a->ahead_register_ms))
        register_started_ahead(a, now);
}

/* A status waiting to be written, due at once or after its rate limit or retry back-off. */
static int64_t status_due(void *arg)
{
    agent *a = arg;
    if (!a->status_dirty || !a->keeper || !a->k_status || a->status_busy)
        return 0; /* (a write on its way: its answer wakes the loop, which flushes after it) */
    return a->status_next_ms ? a->status_next_ms : 1;
}

static void on_status_due(edl_loop *l, void *arg)
{
    (void)l;
    registry_status_flush(arg);
}

/* The reconcile after the turn acts on these: the loop only wakes for them. */
static void wake_only(edl_loop *l, void *arg)
{
    (void)l, (void)arg;
}

static int64_t teacher_timer_due(void *arg)
{
    return teacher_due(arg);
}

static void on_teacher_due(edl_loop *l, void *arg)
{
    (void)l;
    teacher_on_poll(arg, 0); /* the health check moves on libcurl's timers too */
}

/* Whether the agent is done: its trainer gone, and leaving (a signal or a final job state). */
static void stop_when_done(agent *a)
{
    if (trainer_running(&a->tp))
        return;
    if (a->leaving_signal) {
        edl_loop_stop(a->loop, 128 + a->leaving_signal);
    } else if (a->final_exit >= 0 && registry_status_last(a)) {
        registry_unregister(a); /* queued after the last status */
        edl_loop_stop(a->loop, a->final_exit);
    }
}

/* After every wake-up: reap, then reconcile (cheap and idempotent, so it runs after every
 * wake-up rather than only after the events that may matter). */
static void after_turn(edl_loop *l, void *arg)
{
    (void)l;
    agent *a = arg;
    int wstatus;
    bool by_agent;
    if (trainer_reap(&a->tp, &wstatus, &by_agent)) {
        if (a->teacher)
            teacher_on_exit(a, wstatus, by_agent);
        else
            on_trainer_exit(a, wstatus, by_agent);
    }
    register_ahead_when_ready(l, a);
    agent_reconcile(a);
    registry_status_flush(a);
    stop_when_done(a);
}

/* Everything the loop waits on past start-up, each registered once with what it does. */
static int loop_register(agent *a)
{
    edl_loop *l = a->loop;
    int rc = edl_loop_fd_follow(l, keeper_fd, on_keeper, a);
    rc = rc ? rc : edl_loop_fd_follow(l, watch_fd, on_watch, a);
    rc = rc ? rc : edl_loop_fd_follow(l, progress_fd, on_progress, a);
    rc = rc ? rc : edl_loop_fd_follow(l, stderr_fd, on_stderr, a);
    rc = rc ? rc : edl_loop_fd_follow(l, control_fd, on_control, a);
    rc = rc ? rc : edl_loop_timer_follow(l, hang_due, on_hang_due, a);
    rc = rc ? rc : edl_loop_timer_follow(l, stop_due, on_stop_due, a);
    rc = rc ? rc : edl_loop_timer_add(l, &a->watch_next_ms, on_watch_due, a);
    rc = rc ? rc : edl_loop_timer_follow(l, register_due, on_register_due, a);
    rc = rc ? rc : edl_loop_timer_add(l, &a->ahead_register_ms, register_ahead_when_ready, a);
    rc = rc ? rc : edl_loop_timer_follow(l, status_due, on_status_due, a);
    rc = rc ? rc : edl_loop_timer_add(l, &a->master_retry_ms, wake_only, a);
    if (a->teacher) {
        rc = rc ? rc : edl_loop_fd_follow(l, health_fd, on_health, a);
        rc = rc ? rc : edl_loop_timer_follow(l, teacher_timer_due, on_teacher_due, a);
    }
    edl_loop_after_turn(l, after_turn, a);
    return rc;
}

static int agent_loop(agent *a)
{
    if (loop_register(a) != 0) {
        EDL_ERROR("agent", "out of memory setting up its loop");
        return EDL_EXIT_FAILED;
    }
    a->looping = true;
    stop_when_done(a);
    return edl_loop_run(a->loop);
}

static int make_keys(agent *a)
{
    if (!a->o->job)
        return 0; /* a teacher outside any job: its lease and service key only */
    int rc = edl_job_keys_init(&a->keys, a->o->prefix, a->o->job);
    if (rc)
        return rc;
    a->k_pod = edl_job_key_pod(&a->keys, a->o->pod);
    a->k_status = edl_job_key_status(&a->keys, a->o->pod);
    return a->k_pod && a->k_status ? 0 : EDL_ENOMEM;
}

static void agent_free(agent *a)
{
    edl_worker_close(a->worker); /* its queued requests (the revocation) end first */
    if (a->tp.relay) {
        edl_log_set_sink(NULL, NULL);
        stderr_relay_close(a->tp.relay); /* the last lines, the trainer's and ours */
    }
    if (a->keeper)
        edl_lease_keeper_close(a->keeper, false);
    edl_watch_close(a->watch);
    edl_metrics_close(a->metrics);
    edl_loop_free(a->loop);
    edl_etcd_close(a->etcd);
    edl_generation_clear(&a->generation);
    edl_spec_clear(&a->spec);
    free(a->tp.ctl_buf);
    if (a->tp.progress_fd >= 0)
        close(a->tp.progress_fd);
    if (a->tp.control_fd >= 0)
        close(a->tp.control_fd);
    edl_job_keys_clear(&a->keys);
    free(a->k_pod);
    free(a->k_status);
    agent_error_file_close(a);
    health_free(&a->t.probe);
}

static int connect_etcd(agent *a)
{
    edl_etcd_config cfg = a->o->etcd; /* borrowed: edl_etcd_open copies it */
    cfg.timeout_ms = 2000; /* bounds each request of the worker, and start-up's wait for the spec */
    cfg.connect_timeout_ms = 1000;
    int rc = edl_etcd_open(&cfg, &a->etcd);
    if (rc) {
        EDL_ERROR("agent", "invalid etcd settings: %s", edl_strerror(rc));
        return rc;
    }
    if ((rc = edl_worker_open(&a->worker)) != 0 || (rc = edl_loop_worker(a->loop, a->worker)) != 0)
        EDL_ERROR("agent", "cannot start its etcd worker: %s", edl_strerror(rc));
    return rc;
}

int agent_run(agent_opts *o)
{
    agent a = {.o = o, .final_exit = -1, .ps = agent_role_is_ps(o->role),
               .teacher = strcmp(o->role, EDL_ROLE_TEACHER) == 0};
    trainer_init(&a.tp);
    teacher_init(&a);
    edl_spec_init(&a.spec);
    int code = EDL_EXIT_USAGE;
    if (edl_loop_open(1000, &a.loop) != 0 || take_signals(&a) != 0) { /* wakes every second */
        EDL_ERROR("agent", "cannot set up its loop (signalfd: %s)", strerror(errno));
        edl_loop_free(a.loop);
        return EDL_EXIT_FAILED;
    }
    snprintf(a.host, sizeof a.host, "%s", o->host);
    if (make_keys(&a) != 0 || connect_etcd(&a) != 0)
        goto out;
    if (stderr_relay_open(&a.relay, a.loop, STDERR_FILENO) == 0) {
        a.tp.relay = &a.relay;
        edl_log_set_sink(stderr_relay_log, &a.relay); /* its own lines too, in order */
    } else /* the lines are then written on the loop, as before the relay */
        EDL_WARN("agent", "cannot start the thread that writes the trainer's stderr: %s",
                 strerror(errno));
    if (!a.ps && !a.teacher) /* TORCHELASTIC_ERROR_FILE is a worker's */
        agent_error_file_open(&a);
    if (o->metrics_port != 0) {
        edl_metrics_opts mo = {.addr = o->metrics_addr,
                               .port = edl_metrics_listen_port(o->metrics_port)};
        if (edl_metrics_open(&mo, agent_metrics_write, &a, &a.metrics) != 0 ||
            edl_metrics_attach(a.metrics, a.loop) != 0) {
            EDL_ERROR("agent", "cannot serve metrics on %s port %d; choose another "
                      "--metrics-port or --metrics-addr", o->metrics_addr ? o->metrics_addr :
                      "0.0.0.0", mo.port);
            goto out;
        }
    }
    code = o->job ? wait_for_spec(&a) : 0;
    if (code)
        goto out;
    if (a.spec.stopped) {
        EDL_INFO("agent", "job %s is stopped (spec): not joining", o->job);
        code = EDL_EXIT_STOPPED;
        goto out;
    }
    a.ttl_s = o->ttl_s > 0 ? o->ttl_s : a.spec.ttl_s;
    if (ahead_at_start(&a))
        start_ahead(&a); /* the pod registers when its trainer is ready (loop_once) */
    if (a.ahead)
        a.ahead_register_ms = edl_monotonic_ms() + AHEAD_READY_S * 1000;
    else
        registry_register(&a);
    registry_watch_open(&a);
    agent_reconcile(&a);
    code = agent_loop(&a);
out:
    if (trainer_running(&a.tp)) { /* only on an internal error: never leave it orphaned */
        trainer_kill(&a.tp);
        waitpid(a.tp.pid, NULL, 0);
    }
    agent_free(&a);
    EDL_INFO("agent", "exit %d", code);
    return code;
}
