/* reconcile.c: from an observed job to the generation it should have (see reconcile.h).
 *
 * Order of the rules, most urgent first: a final job stays final; a stop request ends it; a
 * trainer that cannot be started fails it; so does the trainer's own bug (script_bug: a
 * failure the trainer marked as its own, every member failing on its own, or one rank failing
 * as it did in the last restarted generation); trainer failures (exit, signal, hang) restart the
 * generation or fail the job (exclusion only for a pod that failed while others ran; in process
 * mode the failed pod sits the restart out until its replacement trainer is ready); all ranks
 * done is success, and so is (in process mode) rank 0 done when no rank failed and the others
 * ended, left or outlived a grace; lost members form a new generation at once; joins
 * wait for the settle window, and for ever once a rank is done; otherwise only details
 * (standbys, spec error) are refreshed.
 *
 * Two roles: workers are the members (ranks, restarts, success, hangs); parameter servers
 * (pods of role "ps") are ranked apart in `servers`. A server whose process ended leaves the
 * servers at once (a failure counts towards its exclusion) but restarts nobody; servers join
 * with the settle window; the job runs only with ps_min servers. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reconcile.h"

#define REASON_MAX 512

typedef struct failure {
    const char *pod;
    int rank;
    int code;      /* exit code, 128+signal, or -1 for a hang */
    bool own;      /* the program's own failure (an exit code or a crash), not one from outside
                    * (SIGKILL: OOM or a drained node; SIGTERM; a hang): see own_failure */
    bool marked;   /* the trainer said so itself (edl_pod_status.own_error) */
    uint32_t message_hash;
    bool blamed;   /* counts against the pod (exclusion): it failed while others ran; not when
                    * it waited on a peer, nor when every member failed */
    bool unstartable; /* the trainer could not be started (cannot_start) */
    char what[320];
} failure;

void js_decision_clear(js_decision *d)
{
    edl_generation_clear(&d->next);
    free(d->probe);
    memset(d, 0, sizeof *d);
}

void js_memory_clear(js_memory *m)
{
    for (size_t i = 0; i < m->n_progress; i++)
        free(m->progress[i].pod);
    free(m->progress);
    for (size_t i = 0; i < m->n_joins; i++)
        free(m->joins[i].pod);
    free(m->joins);
    memset(m, 0, sizeof *m);
}

static int pod_index(const js_observed *o, const char *name, int64_t lease)
{
    for (size_t i = 0; i < o->n_pods; i++)
        if (strcmp(o->pods[i].name, name) == 0 && o->pods[i].lease == lease)
            return (int)i;
    return -1;
}

static const edl_pod_failures *failures_of(const edl_generation *c, const char *pod)
{
    for (size_t i = 0; i < c->n_failures; i++)
        if (strcmp(c->failures[i].pod, pod) == 0)
            return &c->failures[i];
    return NULL;
}

/* The current generation's workers re-form in process: the spec says so, or (the mode not
 * given) every member's agent reports that its trainer said so (edl_pod_status.inprocess,
 * sticky per agent: one status of any generation suffices). Otherwise restart mode. */
static bool in_process(const js_observed *o)
{
    const edl_generation *c = o->current;
    if (o->spec->mode != EDL_MODE_AUTO)
        return o->spec->mode == EDL_MODE_INPROCESS;
    for (size_t k = 0; k < c->n_members; k++) {
        int i = pod_index(o, c->members[k].pod, c->members[k].lease);
        if (i < 0 || !o->has_status[i] || !o->status[i].inprocess)
            return false;
    }
    return c->n_members > 0;
}

/* ---- progress (hang detection) ------------------------------------------------------------ */

static js_progress *progress_entry(js_memory *m, const char *pod)
{
    for (size_t i = 0; i < m->n_progress; i++)
        if (strcmp(m->progress[i].pod, pod) == 0)
            return &m->progress[i];
    js_progress *p = realloc(m->progress, (m->n_progress + 1) * sizeof *p);
    if (!p)
        return NULL;
    m->progress = p;
    p = &m->progress[m->n_progress];
    memset(p, 0, sizeof *p);
    if (!(p->pod = strdup(pod)))
        return NULL;
    p->generation = -1;
    m->n_progress++;
    return p;
}

/* Record a running member's step in the current generation; *advanced when it differs from the
 * one recorded before in this generation (changed_mono_ms: when this step was first seen). */
static js_progress *note_step(js_memory *m, const edl_generation *c, const char *pod,
                              int64_t step, int64_t now, bool *advanced)
{
    js_progress *p = progress_entry(m, pod);
    *advanced = false;
    if (p && (p->generation != c->generation || p->step != step)) {
        *advanced = p->generation == c->generation;
        p->generation = c->generation;
        p->step = step;
        p->changed_mono_ms = now;
    }
    return p;
}

/* Record the step of every running member; return the index of a member that made no progress
 * for the timeout while another advanced within it (-1: none). *wake: next check. */
static int find_hung(const js_observed *o, js_memory *m, int64_t *wake)
{
    const edl_generation *c = o->current;
    int64_t timeout = o->spec->progress_timeout_ms, now = o->mono_ms;
    if (timeout <= 0 || c->state != EDL_JOB_RUNNING)
        return -1;
    bool someone_advanced = false;
    for (size_t k = 0; k < c->n_members; k++) {
        int i = pod_index(o, c->members[k].pod, c->members[k].lease);
        if (i < 0 || !o->has_status[i] || o->status[i].generation != c->generation ||
            o->status[i].state != EDL_TRAINER_RUNNING)
            continue;
        bool advanced;
        js_progress *p = note_step(m, c, c->members[k].pod, o->status[i].step, now, &advanced);
        if (!p)
            return -1;
        if (advanced || (now - p->changed_mono_ms <= timeout && p->step >= 0))
            someone_advanced = true;
    }
    /* Running statuses do not wake the server (see jobserver.c): sample them regularly, so a
     * step is seen within a quarter of the timeout of when it changed. */
    int64_t sample = now + (timeout / 4 > 50 ? timeout / 4 : 50);
    if (!*wake || sample < *wake)
        *wake = sample;
    int hung = -1;
    for (size_t k = 0; k < c->n_members; k++) {
        int i = pod_index(o, c->members[k].pod, c->members[k].lease);
        js_progress *p;
        if (i < 0 || !o->has_status[i] || o->status[i].state != EDL_TRAINER_RUNNING ||
            o->status[i].generation != c->generation || !(p = progress_entry(m, c->members[k].pod)))
            continue;
        int64_t due = p->changed_mono_ms + timeout + 1;
        if (now >= due && someone_advanced && hung < 0)
            hung = (int)k;
        if (!*wake || due < *wake)
            *wake = due;
    }
    return hung;
}

/* ---- trainer failures and success --------------------------------------------------------- */

/* The trainer could not be started: its agent could not execute it (it reports 127 and says
 * why in the message), or a shell in front of it said so (126: found but not executable, 127:
 * not found). Restarting cannot help. One that reported a step had started: its 126 or 127 is
 * an ordinary failure. */
static bool cannot_start(const edl_pod_status *s)
{
    return s->state == EDL_TRAINER_EXITED && (s->exit_code == 126 || s->exit_code == 127) &&
           s->step < 0;
}

/* Signals that say the program itself went wrong (a crash), as against those that end a
 * process from outside: SIGKILL (the OOM killer, a drained node), SIGTERM, SIGINT, SIGHUP. */
static bool crash_signal(int sig)
{
    return sig == SIGSEGV || sig == SIGABRT || sig == SIGBUS || sig == SIGFPE || sig == SIGILL;
}

/* The program failed by itself: an exit code (a shell's 128 + N for its child's signal N is
 * judged as that signal) or a crash. Restarting such a failure repeats it unless the cause was
 * outside (the judgement in script_bug decides when it was not). */
static bool own_failure(const edl_pod_status *s)
{
    if (s->state == EDL_TRAINER_SIGNALED)
        return crash_signal(s->signal);
    if (s->state != EDL_TRAINER_EXITED || s->exit_code == 0)
        return false;
    return s->exit_code > 128 && s->exit_code < 128 + 65 ? crash_signal(s->exit_code - 128)
                                                         : true;
}

/* FNV-1a: messages are compared by their hash (kept in js_memory). */
static uint32_t message_hash(const char *m)
{
    uint32_t h = 2166136261u;
    for (; *m; m++)
        h = (h ^ (unsigned char)*m) * 16777619u;
    return h;
}

/* A member's status as a failure (false: it is no failure). A trainer's own message (its
 * error file, why it hung, why it could not be started) follows, cut to fit. */
static bool describe_failure(const edl_member *mb, const char *role, const edl_pod_status *s,
                             failure *f)
{
    const char *msg = s->message[0] ? s->message : NULL;
    int len = 0;
    f->pod = mb->pod;
    f->rank = mb->rank;
    f->blamed = true;
    f->unstartable = cannot_start(s);
    f->own = own_failure(s);
    f->marked = f->own && s->own_error;
    f->message_hash = message_hash(s->message);
    char failed[48];
    if (!edl_trainer_failure(s, failed, sizeof failed))
        return false;
    if (s->state == EDL_TRAINER_EXITED) {
        f->code = s->exit_code;
    } else if (s->state == EDL_TRAINER_SIGNALED) {
        f->code = 128 + s->signal;
    } else { /* hung: it waited on a peer inside a collective: the generation is stuck, not
              * this pod's fault as far as anyone can tell, so a restart but no exclusion */
        f->code = -1;
        f->blamed = false;
    }
    len = snprintf(f->what, sizeof f->what, "pod %s (%s %d) %s", mb->pod, role, mb->rank, failed);
    if (msg && len > 0 && (size_t)len < sizeof f->what)
        snprintf(f->what + len, sizeof f->what - (size_t)len, ": %.*s",
                 (int)(sizeof f->what - (size_t)len), msg);
    return true;
}

/* Collect failed members of the current generation; *all_done when every member exited 0,
 * *finishing when one did (the job is ending: joins no longer form a generation, as torch's
 * rendezvous closes once a worker succeeded).
 * Exclusion is for a pod that fails while others run (or finished): when no member of the
 * generation reports its trainer running or done, every member failed (a broken program or
 * input, not a bad pod), and nobody is blamed: the restart budget alone bounds the job. */
static size_t collect_failures(const js_observed *o, js_memory *m, failure *fl, bool *all_done,
                               bool *finishing, int64_t *wake)
{
    const edl_generation *c = o->current;
    size_t n = 0, done = 0, running = 0;
    *all_done = *finishing = false;
    if (c->state != EDL_JOB_RUNNING || c->generation == 0)
        return 0;
    for (size_t k = 0; k < c->n_members; k++) {
        int i = pod_index(o, c->members[k].pod, c->members[k].lease);
        if (i < 0 || !o->has_status[i] || o->status[i].generation != c->generation)
            continue;
        const edl_pod_status *s = &o->status[i];
        if (s->state == EDL_TRAINER_EXITED && s->exit_code == 0)
            done++;
        else if (describe_failure(&c->members[k], "rank", s, &fl[n]))
            n++;
        else
            running += s->state == EDL_TRAINER_RUNNING;
    }
    for (size_t k = 0; k < n && running + done == 0; k++)
        fl[k].blamed = false;
    if (n == 0) {
        int h = find_hung(o, m, wake);
        if (h >= 0) {
            fl[0].pod = c->members[h].pod;
            fl[0].rank = c->members[h].rank;
            fl[0].code = -1;
            fl[0].blamed = true;
            snprintf(fl[0].what, sizeof fl[0].what,
                     "pod %s (rank %d) made no progress for %lld ms while others advanced",
                     c->members[h].pod, c->members[h].rank,
                     (long long)o->spec->progress_timeout_ms);
            n = 1;
        }
    }
    *all_done = n == 0 && c->n_members > 0 && done == c->n_members;
    *finishing = done > 0;
    return n;
}

/* How long the other ranks of an in-process job without parameter servers may run on after
 * rank 0 exited 0 before the job succeeds without them (their trainers are stopped). Such
 * trainers re-form one collective (edl.torch, libedlcoll): its ranks advance together and end
 * within a step of each other; one that does not took no part in the last steps: a pod that
 * joined just as rank 0 finished, waiting for rank 0's store, which closed with rank 0.
 * Shorter than a trainer's rendezvous timeout (edl.torch: 60 s), so such a pod is stopped
 * before it fails and spends a restart. Restart mode runs any program, ranks that share no
 * collective among them (a shard each): there every rank must end. */
#define FINISH_GRACE_MS 30000

typedef enum finish { FINISH_NONE, FINISH_WAIT, FINISH_NOW } finish;

/* Rank 0 of an in-process job without parameter servers exited 0 in the current generation
 * and no member failed: FINISH_NOW when the job succeeds (every other rank exited 0 or left,
 * or outlived the grace: reason written), FINISH_WAIT until then (*wake set). Failures are
 * judged as ever. */
static finish rank0_finished(const js_observed *o, js_memory *m, const failure *fl, size_t nf,
                             char *reason, size_t len, int64_t *wake)
{
    const edl_generation *c = o->current;
    if (!in_process(o) || o->spec->ps_max > 0 || c->state != EDL_JOB_RUNNING ||
        c->generation == 0)
        return FINISH_NONE;
    for (size_t k = 0; k < nf; k++)
        if (fl[k].code >= 0) /* an exit or a signal; a hang (-1) may be one waiting on rank 0 */
            return FINISH_NONE;
    const edl_member *rank0 = NULL;
    size_t running = 0;
    for (size_t k = 0; k < c->n_members; k++) {
        int i = pod_index(o, c->members[k].pod, c->members[k].lease);
        const edl_pod_status *s = i >= 0 && o->has_status[i] &&
                                  o->status[i].generation == c->generation ? &o->status[i] : NULL;
        bool done = s && s->state == EDL_TRAINER_EXITED && s->exit_code == 0;
        if (c->members[k].rank == 0 && !done)
            return FINISH_NONE;
        if (c->members[k].rank == 0)
            rank0 = &c->members[k];
        else
            running += i >= 0 && !done;
    }
    if (!rank0)
        return FINISH_NONE;
    if (m->finish_gen != c->generation) {
        m->finish_gen = c->generation;
        m->finish_since_mono_ms = o->mono_ms;
    }
    int64_t due = m->finish_since_mono_ms + FINISH_GRACE_MS;
    if (running && o->mono_ms < due) {
        if (!*wake || due < *wake)
            *wake = due;
        return FINISH_WAIT;
    }
    if (running)
        snprintf(reason, len, "rank 0 (pod %s) exited 0 and %zu other rank%s still ran %d s "
                 "later: the job succeeded on rank 0's result (a rank that did not end with "
                 "rank 0 took no part in its last steps); stopping them", rank0->pod, running,
                 running == 1 ? "" : "s", FINISH_GRACE_MS / 1000);
    else
        snprintf(reason, len, "rank 0 (pod %s) exited 0; the other ranks exited 0 or left",
                 rank0->pod);
    return FINISH_NOW;
}

/* The process of pods[i], a ps pod, ended in the current generation (exited or killed): it
 * leaves the servers, and stays out until its agent reports again for a later generation. */
static bool server_ended(const js_observed *o, size_t i)
{
    const edl_pod_status *s = &o->status[i];
    return o->has_status[i] && o->current->generation > 0 &&
           s->generation == o->current->generation &&
           (s->state == EDL_TRAINER_EXITED || s->state == EDL_TRAINER_SIGNALED);
}

/* Servers of the current generation whose process failed in it (exit 0 is a clean leave, no
 * failure). They count towards the pod's exclusion like a worker's failure, but restart
 * nobody and spend no restart budget. In fl (room for every server); returns how many. */
static size_t collect_server_failures(const js_observed *o, failure *fl)
{
    const edl_generation *c = o->current;
    size_t n = 0;
    for (size_t k = 0; k < c->n_servers; k++) {
        int i = pod_index(o, c->servers[k].pod, c->servers[k].lease);
        if (i >= 0 && server_ended(o, (size_t)i) &&
            !(o->status[i].state == EDL_TRAINER_EXITED && o->status[i].exit_code == 0) &&
            describe_failure(&c->servers[k], "server", &o->status[i], &fl[n]))
            n++;
    }
    return n;
}

/* The failure list of the next generation: counts bumped for the failed pods, exclusions set
 * for repeat offenders, entries of pods that are gone and no longer excluded dropped. */
static int next_failures(const js_observed *o, const failure *fl, size_t nf, edl_generation *next)
{
    const edl_generation *c = o->current;
    const edl_job_spec *sp = o->spec;
    next->failures = calloc(c->n_failures + nf + 1, sizeof *next->failures);
    if (!next->failures)
        return EDL_ENOMEM;
    for (size_t i = 0; i < c->n_failures; i++) {
        const edl_pod_failures *f = &c->failures[i];
        bool live = false;
        for (size_t p = 0; p < o->n_pods; p++)
            live = live || strcmp(o->pods[p].name, f->pod) == 0;
        if (!live && f->excluded_until <= o->now_ms)
            continue;
        edl_pod_failures *g = &next->failures[next->n_failures++];
        *g = *f;
        if (!(g->pod = strdup(f->pod)))
            return EDL_ENOMEM;
    }
    for (size_t k = 0; k < nf; k++) {
        if (!fl[k].blamed)
            continue;
        edl_pod_failures *g = NULL;
        for (size_t i = 0; i < next->n_failures; i++)
            if (strcmp(next->failures[i].pod, fl[k].pod) == 0)
                g = &next->failures[i];
        if (!g) {
            g = &next->failures[next->n_failures++];
            memset(g, 0, sizeof *g);
            if (!(g->pod = strdup(fl[k].pod)))
                return EDL_ENOMEM;
        }
        if (g->count < EDL_RESTARTS_MAX) /* a document may hold up to the bound */
            g->count++;
        if (g->count >= sp->exclude_after) {
            int64_t cd = sp->cooldown_ms;
            for (int e = sp->exclude_after; e < g->count && cd < sp->cooldown_max_ms; e++)
                cd *= 2;
            if (cd > sp->cooldown_max_ms)
                cd = sp->cooldown_max_ms;
            g->excluded_until = o->now_ms + cd;
        }
    }
    return 0;
}

/* ---- composing the next document ---------------------------------------------------------- */

/* The same pods (name and lease) at the same ranks. */
static bool same_members(const edl_member *a, size_t na, const edl_member *m, size_t n)
{
    if (na != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(a[i].pod, m[i].pod) != 0 || a[i].lease != m[i].lease || a[i].rank != m[i].rank)
            return false;
    return true;
}

static bool same_standbys(const edl_generation *c, char **sb, size_t n)
{
    if (c->n_standbys != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(c->standbys[i], sb[i]) != 0)
            return false;
    return true;
}

static bool same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* The number of a new generation: one past the current one, and never at or below one that an
 * agent reports having run (a document restored from an old backup must not repeat numbers). */
static int64_t next_generation_number(const js_observed *o)
{
    int64_t base = o->current->generation;
    if (o->max_status_gen > base)
        base = o->max_status_gen;
    return base + 1;
}

/* A copy of the current document with a new state, reason and publisher. */
static int copy_current(const js_observed *o, edl_generation *next)
{
    const edl_generation *c = o->current;
    memset(next, 0, sizeof *next);
    next->generation = c->generation;
    next->members_generation = c->members_generation;
    next->state = c->state;
    next->restarts = c->restarts;
    next->published_ms = o->now_ms;
    next->started_ms = c->started_ms > 0 ? c->started_ms : o->now_ms; /* the run's first */
    if (edl_members_copy(c->members, c->n_members, &next->members) != 0)
        return EDL_ENOMEM;
    next->n_members = c->n_members;
    if (c->n_servers && edl_members_copy(c->servers, c->n_servers, &next->servers) != 0)
        return EDL_ENOMEM;
    next->n_servers = c->n_servers;
    next->standbys = calloc(c->n_standbys + 1, sizeof *next->standbys);
    next->failures = calloc(c->n_failures + 1, sizeof *next->failures);
    if (!next->standbys || !next->failures)
        return EDL_ENOMEM;
    for (; next->n_standbys < c->n_standbys; next->n_standbys++)
        if (!(next->standbys[next->n_standbys] = strdup(c->standbys[next->n_standbys])))
            return EDL_ENOMEM;
    for (; next->n_failures < c->n_failures; next->n_failures++) {
        next->failures[next->n_failures] = c->failures[next->n_failures];
        if (!(next->failures[next->n_failures].pod = strdup(c->failures[next->n_failures].pod)))
            return EDL_ENOMEM;
    }
    if ((c->reason && !(next->reason = strdup(c->reason))) ||
        (o->spec_error && !(next->spec_error = strdup(o->spec_error))) ||
        (o->leader_id && !(next->leader = strdup(o->leader_id))))
        return EDL_ENOMEM;
    return 0;
}

static int set_reason(edl_generation *next, const char *reason)
{
    free(next->reason);
    next->reason = strdup(reason);
    return next->reason ? 0 : EDL_ENOMEM;
}

/* Final state in the same generation (success, failure, stop). */
static int publish_final(const js_observed *o, edl_job_state st, const char *reason,
                         js_decision *out)
{
    int rc = copy_current(o, &out->next);
    if (!rc)
        rc = set_reason(&out->next, reason);
    out->next.state = st;
    out->action = JS_PUBLISH;
    return rc;
}

/* The same incarnation (pod name and lease) is in m[0..n). */
static bool has_incarnation(const edl_member *m, size_t n, const edl_member *x)
{
    for (size_t j = 0; j < n; j++)
        if (strcmp(m[j].pod, x->pod) == 0 && m[j].lease == x->lease)
            return true;
    return false;
}

/* Describe a change of one list into buf at *used: "pod a left; pod b joined" (bounded);
 * who: "pod" for members, "server" for servers. */
static void describe_list_change(const edl_member *old, size_t n_old, const edl_member *m,
                                 size_t n, const char *who, char *buf, size_t len, size_t *used)
{
    for (size_t i = 0; i < n_old && *used < len; i++)
        if (!has_incarnation(m, n, &old[i]))
            *used += (size_t)snprintf(buf + *used, len - *used, "%s%s %s left",
                                      *used ? "; " : "", who, old[i].pod);
    for (size_t j = 0; j < n && *used < len; j++)
        if (!has_incarnation(old, n_old, &m[j]))
            *used += (size_t)snprintf(buf + *used, len - *used, "%s%s %s joined",
                                      *used ? "; " : "", who, m[j].pod);
}

/* The membership the next generation would have. */
typedef struct membership {
    edl_member *members;
    size_t n;
    edl_member *servers;
    size_t n_servers;
    char **standbys;         /* workers', then ps pods' */
    size_t n_standbys;
} membership;

/* Describe the change from the current generation: "pod a left; server s joined" (bounded). */
static void describe_change(const edl_generation *c, const membership *ms, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    describe_list_change(c->members, c->n_members, ms->members, ms->n, "pod", buf, len, &used);
    describe_list_change(c->servers, c->n_servers, ms->servers, ms->n_servers, "server", buf,
                         len, &used);
}

static void membership_clear(membership *ms)
{
    edl_members_free(ms->members, ms->n);
    edl_members_free(ms->servers, ms->n_servers);
    for (size_t i = 0; i < ms->n_standbys; i++)
        free(ms->standbys[i]);
    free(ms->standbys);
    memset(ms, 0, sizeof *ms);
}

static bool is_worker(const edl_pod *p)
{
    return !p->role || strcmp(p->role, EDL_ROLE_WORKER) == 0;
}

static bool is_server(const edl_pod *p)
{
    return p->role && strcmp(p->role, EDL_ROLE_PS) == 0;
}

/* Append the server standbys to the workers' (both lists are taken). */
static int join_standbys(membership *ms, char **sb, size_t n)
{
    char **v = realloc(ms->standbys, (ms->n_standbys + n + 1) * sizeof *v);
    if (!v) {
        for (size_t i = 0; i < n; i++)
            free(sb[i]);
        free(sb);
        return EDL_ENOMEM;
    }
    memcpy(v + ms->n_standbys, sb, n * sizeof *sb);
    ms->standbys = v;
    ms->n_standbys += n;
    free(sb);
    return 0;
}

/* In process mode without parameter servers, a worker whose trainer failed (an exit other than
 * 0, a signal) stays out of the membership until its agent reports for a later generation: the
 * agent starts the replacement trainer ahead (it imports its framework meanwhile) and reports
 * "waiting" once it is ready. So the survivors re-form without it at once, as after a lost
 * pod, instead of waiting in the new group while it starts, and it comes back as a join (the
 * settle window batches it). Restart mode restarts every trainer anyway: it stays a member. */
static bool awaiting_replacement(const js_observed *o, size_t i)
{
    const edl_pod_status *s = &o->status[i];
    return o->spec->mode == EDL_MODE_INPROCESS && o->spec->ps_max == 0 && o->has_status[i] &&
           (s->state == EDL_TRAINER_SIGNALED ||
            (s->state == EDL_TRAINER_EXITED && s->exit_code != 0));
}

/* Who may be a member or a server now: live pods that are not excluded (by `failures`, the
 * exclusions in force for the next generation) nor awaiting their replacement trainer, split by
 * role (a ps pod whose process ended in this generation is out), each role ranked by the rank
 * rule. Pods of another role are
 * ignored (the job server logs them). *wake_excl: when the first exclusion ends (0: none). */
static int next_membership(const js_observed *o, const edl_generation *failures,
                           membership *ms, int64_t *wake_excl)
{
    edl_pod *work = calloc(o->n_pods + 1, sizeof *work), *ps = calloc(o->n_pods + 1, sizeof *ps);
    size_t nw = 0, np = 0, n_ssb = 0;
    char **ssb = NULL;
    int rc = work && ps ? 0 : EDL_ENOMEM;
    *wake_excl = 0;
    for (size_t i = 0; !rc && i < o->n_pods; i++) {
        const edl_pod_failures *f = failures_of(failures, o->pods[i].name);
        if (f && f->excluded_until > o->now_ms) {
            int64_t at = o->mono_ms + (f->excluded_until - o->now_ms) + 1;
            if (!*wake_excl || at < *wake_excl)
                *wake_excl = at;
            continue;
        }
        if (is_worker(&o->pods[i]) && !awaiting_replacement(o, i))
            work[nw++] = o->pods[i];
        else if (is_server(&o->pods[i]) && !server_ended(o, i))
            ps[np++] = o->pods[i];
    }
    const edl_generation *c = o->current;
    if (!rc)
        rc = edl_assign_ranks(c->members, c->n_members, work, nw, o->spec->max, &ms->members,
                              &ms->n, &ms->standbys, &ms->n_standbys);
    if (!rc)
        rc = edl_assign_ranks(c->servers, c->n_servers, ps, np, o->spec->ps_max, &ms->servers,
                              &ms->n_servers, &ssb, &n_ssb);
    if (!rc)
        rc = join_standbys(ms, ssb, n_ssb);
    free(work);
    free(ps);
    return rc;
}

/* Why a new generation is published. sf: the first server failure (NULL: none). */
static void new_reason(const js_observed *o, const failure *fl, size_t nf, const failure *sf,
                       bool dead, edl_job_state st, const membership *ms, char *reason,
                       size_t len)
{
    const edl_generation *c = o->current;
    const edl_job_spec *sp = o->spec;
    char why[REASON_MAX];
    describe_change(c, ms, why, sizeof why);
    if (nf)
        snprintf(reason, len, "restart %d of %d after %s%s", c->restarts + 1, sp->max_restarts,
                 fl[0].what, fl[0].blamed || fl[0].code < 0 ? "" :
                 " (every member failed: nobody is excluded)");
    else if (dead)
        snprintf(reason, len, "restart %d of %d: generation %lld declared dead by its trainers: "
                 "%.200s", c->restarts + 1, sp->max_restarts, (long long)c->generation,
                 o->gen_dead);
    else if (st == EDL_JOB_WAITING && sp->ps_max > 0)
        snprintf(reason, len, "waiting: %zu of at least %d members, %zu of at least %d servers"
                 "%s%s", ms->n, sp->min, ms->n_servers, sp->ps_min, why[0] ? "; " : "", why);
    else if (st == EDL_JOB_WAITING)
        snprintf(reason, len, "waiting: %zu of at least %d members%s%s", ms->n, sp->min,
                 why[0] ? "; " : "", why);
    else if (sf)
        snprintf(reason, len, "%s (no restart)%s%s", sf->what, why[0] ? "; " : "", why);
    else
        snprintf(reason, len, "%s", why[0] ? why : "membership unchanged");
}

/* The next document: the current one with the new standbys (taken from ms), the failures in
 * force (taken from failures when given), and, for a new generation, the new members (from
 * ms), its number, state and reason. */
static int compose_next(const js_observed *o, membership *ms, edl_generation *failures,
                        bool restart, bool new_gen, edl_job_state st, const char *reason,
                        js_decision *out)
{
    edl_generation *next = &out->next;
    int rc = copy_current(o, next);
    if (rc)
        return rc;
    if (failures) {
        edl_generation none = {.failures = next->failures, .n_failures = next->n_failures};
        edl_generation_clear(&none);
        next->failures = failures->failures;
        next->n_failures = failures->n_failures;
        failures->failures = NULL;
        failures->n_failures = 0;
    }
    if (restart) /* a failure or a dead group: either costs a restart */
        next->restarts = o->current->restarts + 1;
    /* Members change only with the generation: a refresh of details in the same generation
     * (standbys, spec error) must not carry joins that are still settling. */
    edl_generation old = {.standbys = next->standbys, .n_standbys = next->n_standbys};
    if (new_gen) {
        old.members = next->members;
        old.n_members = next->n_members;
        old.servers = next->servers;
        old.n_servers = next->n_servers;
        next->members = ms->members;
        next->n_members = ms->n;
        next->servers = ms->servers;
        next->n_servers = ms->n_servers;
        ms->members = NULL;
        ms->n = 0;
        ms->servers = NULL;
        ms->n_servers = 0;
    }
    edl_generation_clear(&old);
    next->standbys = ms->standbys;
    next->n_standbys = ms->n_standbys;
    ms->standbys = NULL;
    ms->n_standbys = 0;
    if (!new_gen)
        return 0;
    const edl_generation *c = o->current;
    bool workers_kept = !restart && c->generation > 0 && c->state == EDL_JOB_RUNNING &&
                        st == EDL_JOB_RUNNING && same_members(c->members, c->n_members,
                                                              next->members, next->n_members);
    next->generation = next_generation_number(o);
    /* only the servers changed: the workers keep their trainers and their rendezvous */
    next->members_generation = workers_kept ? edl_generation_of_members(c) : 0;
    next->state = st;
    out->new_generation = true;
    return set_reason(next, reason);
}

/* The pending joins of list m[0..n) (those the current list cur lacks) into v at *nv, each with
 * when it was first seen: kept from mem, else now. */
static int note_joins(const edl_member *cur, size_t n_cur, const edl_member *m, size_t n,
                      const js_memory *mem, int64_t now, js_join *v, size_t *nv)
{
    for (size_t j = 0; j < n; j++) {
        if (has_incarnation(cur, n_cur, &m[j]))
            continue;
        int64_t since = now;
        for (size_t i = 0; i < mem->n_joins; i++)
            if (strcmp(mem->joins[i].pod, m[j].pod) == 0 && mem->joins[i].lease == m[j].lease)
                since = mem->joins[i].since_mono_ms;
        if (!(v[*nv].pod = strdup(m[j].pod)))
            return EDL_ENOMEM;
        v[*nv].lease = m[j].lease;
        v[(*nv)++].since_mono_ms = since;
    }
    return 0;
}

/* Remember the joins pending now (members and servers of ms that the current generation lacks)
 * and forget the rest: a pod that left before its join was published neither opens nor
 * shortens the settle window of those that stay. */
static int track_joins(const js_observed *o, const membership *ms, js_memory *mem)
{
    const edl_generation *c = o->current;
    js_join *v = calloc(ms->n + ms->n_servers + 1, sizeof *v);
    size_t nv = 0;
    int rc = v ? note_joins(c->members, c->n_members, ms->members, ms->n, mem, o->mono_ms, v,
                            &nv)
               : EDL_ENOMEM;
    if (!rc)
        rc = note_joins(c->servers, c->n_servers, ms->servers, ms->n_servers, mem, o->mono_ms, v,
                        &nv);
    js_memory old = {.joins = v, .n_joins = nv};
    if (!rc) { /* v becomes the memory's, the old list is freed */
        old.joins = mem->joins;
        old.n_joins = mem->n_joins;
        mem->joins = v;
        mem->n_joins = nv;
    }
    js_memory_clear(&old);
    return rc;
}

/* Joins only: hold them until the settle window, opened by the earliest join still pending,
 * closes. True while it is open (*wake set). */
static bool settling(const js_observed *o, const js_memory *mem, int64_t *wake)
{
    if (mem->n_joins == 0)
        return false;
    int64_t first = mem->joins[0].since_mono_ms;
    for (size_t i = 1; i < mem->n_joins; i++)
        if (mem->joins[i].since_mono_ms < first)
            first = mem->joins[i].since_mono_ms;
    int64_t due = first + o->spec->settle_ms;
    if (o->mono_ms >= due)
        return false;
    *wake = due;
    return true;
}

/* Worker failures fl[0..nf) and server failures sf[0..nsf) as one list (malloc'ed). */
static failure *all_failures(const failure *fl, size_t nf, const failure *sf, size_t nsf)
{
    failure *all = calloc(nf + nsf + 1, sizeof *all);
    if (all) {
        memcpy(all, fl, nf * sizeof *fl);
        memcpy(all + nf, sf, nsf * sizeof *sf);
    }
    return all;
}

/* A member or server of the current generation is not in the next one (left, excluded, its
 * server process ended): publish at once, no settle window. */
static bool membership_lost(const edl_generation *c, const membership *ms)
{
    for (size_t i = 0; i < c->n_members; i++)
        if (!has_incarnation(ms->members, ms->n, &c->members[i]))
            return true;
    for (size_t i = 0; i < c->n_servers; i++)
        if (!has_incarnation(ms->servers, ms->n_servers, &c->servers[i]))
            return true;
    return false;
}

/* Running needs min workers and, with the ps role, ps_min servers. */
static edl_job_state next_state(const edl_job_spec *sp, const membership *ms)
{
    bool servers_ok = sp->ps_max <= 0 || (int)ms->n_servers >= sp->ps_min;
    return (int)ms->n >= sp->min && servers_ok ? EDL_JOB_RUNNING : EDL_JOB_WAITING;
}

/* Membership step: candidates, ranks, and whether to publish now, later, or not at all. Worker
 * failures (fl, nf) restart the generation; server failures only drop the server. */
static int reconcile_membership(const js_observed *o, js_memory *mem, const failure *fl,
                                size_t nf, bool dead, bool finishing, js_decision *out)
{
    const edl_generation *c = o->current;
    edl_generation failures = {0}; /* the failures in force for the next generation */
    membership ms = {0};
    int64_t wake_excl = 0;
    failure *sf = calloc(c->n_servers + 1, sizeof *sf), *all = NULL;
    size_t nsf = sf ? collect_server_failures(o, sf) : 0;
    int rc = sf ? 0 : EDL_ENOMEM;
    if (!rc && (nf || nsf))
        rc = (all = all_failures(fl, nf, sf, nsf)) ? next_failures(o, all, nf + nsf, &failures)
                                                   : EDL_ENOMEM;
    if (!rc)
        rc = next_membership(o, nf || nsf ? &failures : c, &ms, &wake_excl);
    if (!rc)
        rc = track_joins(o, &ms, mem);
    if (rc)
        goto out;
    bool lost = membership_lost(c, &ms);
    edl_job_state st = next_state(o->spec, &ms);
    bool changed = !same_members(c->members, c->n_members, ms.members, ms.n) ||
                   !same_members(c->servers, c->n_servers, ms.servers, ms.n_servers);
    bool new_gen = nf > 0 || dead || changed || st != c->state || c->generation == 0;
    if (c->generation == 0 && ms.n == 0 && ms.n_servers == 0)
        new_gen = false; /* nobody yet: nothing to publish */
    bool joins_only = new_gen && nf == 0 && !dead && !lost && changed;
    if (joins_only && (finishing || settling(o, mem, &out->wake_mono_ms)))
        new_gen = false;
    bool details = !same_standbys(c, ms.standbys, ms.n_standbys) ||
                   !same_str(c->spec_error, o->spec_error);
    if (new_gen || (details && c->generation > 0)) {
        char reason[REASON_MAX + 200] = "";
        if (new_gen)
            new_reason(o, fl, nf, nsf ? &sf[0] : NULL, dead, st, &ms, reason, sizeof reason);
        rc = compose_next(o, &ms, nf || nsf ? &failures : NULL, nf || dead, new_gen, st, reason,
                          out);
        out->action = rc ? JS_NOTHING : JS_PUBLISH;
    }
    if (wake_excl && (!out->wake_mono_ms || wake_excl < out->wake_mono_ms))
        out->wake_mono_ms = wake_excl;
out:
    membership_clear(&ms);
    edl_generation_clear(&failures);
    free(sf);
    free(all);
    return rc;
}

/* How long pods[i] may stay silent before etcd drops it: its lease TTL (the spec's when the
 * pod does not say). */
static int64_t pod_ttl_ms(const js_observed *o, int i)
{
    return (o->pods[i].ttl_s ? o->pods[i].ttl_s : o->spec->ttl_s) * 1000;
}

/* A member of the current generation whose pod is gone (its lease expired or it left). */
static bool member_lost(const js_observed *o)
{
    const edl_generation *c = o->current;
    for (size_t k = 0; k < c->n_members; k++)
        if (pod_index(o, c->members[k].pod, c->members[k].lease) < 0)
            return true;
    return false;
}

/* When trainers exit because a peer vanished (torchrun-style trainers exit on a broken
 * collective), the peer whose agent died reports nothing: its status stays "running" until its
 * lease expires. Blaming the survivors would spend the restart budget and exclude healthy pods,
 * so in restart mode the decision waits while a member still reports running, or has not
 * reported for this generation yet (its trainer may be starting: whether it fails too decides
 * who is blamed, see collect_failures), until it reports or its pod disappears (then it is a
 * loss: see js_reconcile), at most its lease TTL (plus etcd's expiry check) from the first
 * failure seen. A member whose step advanced after that is not silent (its agent wrote since):
 * nobody is waited for then, so a rank killed beside trainers that step on is restarted within
 * about a second (the agent writes steps once a second; running statuses wake nobody, so the
 * hold samples them). A member whose lease was renewed after the hold began is not silent
 * either (its agent is alive: its trainer is blocked in a collective, not gone): the job server
 * probes the leases of those the hold waits for (out->probe, js_observed.renewed) every
 * HOLD_PROBE_MS, so a failure beside peers blocked in a collective is decided about a third of
 * a TTL (the agents' renewal period) and a second after it, not a TTL. True while holding
 * (*wake set; out->waiting: whom it waits for). In-process trainers keep running by design,
 * and so do the workers of a job with parameter servers (they share no collective: each talks
 * to the servers only), so there a running status says nothing: no hold, and the failed
 * worker's share is not left idle for a lease TTL. */
#define HOLD_SAMPLE_MS 250
#define HOLD_PROBE_MS 1000
static bool hold_for_silent_peers(const js_observed *o, js_memory *m, const failure *fl,
                                  size_t nf, int64_t *wake, js_decision *out)
{
    char *why = out->waiting;
    size_t len = sizeof out->waiting;
    const edl_generation *c = o->current;
    int64_t ttl_ms = 0;
    bool exits = false, stepping = false;
    const char *silent = NULL;
    for (size_t k = 0; k < nf; k++)
        exits = exits || fl[k].code >= 0; /* a hang is no peer's loss: its agent reported it */
    if (!exits || in_process(o) || o->spec->ps_max > 0)
        return false;
    if (m->hold_gen != c->generation) {
        m->hold_gen = c->generation;
        m->hold_since_mono_ms = o->mono_ms;
    }
    for (size_t k = 0; k < c->n_members; k++) {
        int i = pod_index(o, c->members[k].pod, c->members[k].lease);
        bool reported = i >= 0 && o->has_status[i] && o->status[i].generation == c->generation;
        if (i < 0 || (reported && o->status[i].state != EDL_TRAINER_RUNNING))
            continue;
        if (o->renewed && o->renewed[i])
            continue; /* its agent renewed its lease since: alive, its trainer blocked */
        if (reported && o->status[i].step >= 0) {
            bool advanced;
            js_progress *p = note_step(m, c, c->members[k].pod, o->status[i].step, o->mono_ms,
                                       &advanced);
            if (p && p->changed_mono_ms > m->hold_since_mono_ms)
                continue; /* stepped since the failure */
            stepping = true;
        }
        int64_t t = pod_ttl_ms(o, i);
        ttl_ms = t > ttl_ms ? t : ttl_ms;
        silent = silent ? silent : c->members[k].pod;
        if (!out->probe && !(out->probe = calloc(c->n_members, sizeof *out->probe)))
            return false; /* out of memory: decide now rather than hold blind */
        out->probe[out->n_probe++] = (size_t)i;
    }
    int64_t due = m->hold_since_mono_ms + ttl_ms + EDL_HOLD_MARGIN_MS;
    if (!ttl_ms || o->mono_ms >= due) {
        free(out->probe);
        out->probe = NULL, out->n_probe = 0;
        return false;
    }
    snprintf(why, len, "%s; waiting up to %.1f s for pod %s to step, fail or vanish (it may be "
             "silent: a pod whose agent died reports nothing until its lease expires)",
             fl[0].what, (double)(ttl_ms + EDL_HOLD_MARGIN_MS) / 1000, silent);
    if (stepping && o->mono_ms + HOLD_SAMPLE_MS < due)
        due = o->mono_ms + HOLD_SAMPLE_MS;
    else if (out->n_probe && o->mono_ms + HOLD_PROBE_MS < due)
        due = o->mono_ms + HOLD_PROBE_MS;
    if (!*wake || due < *wake)
        *wake = due;
    return true;
}

/* A dead generation whose survivors said they live on (gen/<n>/alive/<rank>, libedlcoll): a
 * member that still reports running but never said so may be silent (its agent died with its
 * trainer). Until it says so or its pod disappears (a loss, no restart: js_reconcile), wait, at
 * most its lease TTL + 1 s from when the generation was declared dead. The time to wait until
 * (0: nobody is silent). */
static int64_t silent_until(const js_observed *o, int64_t dead_since)
{
    const edl_generation *c = o->current;
    int64_t ttl_ms = 0;
    for (size_t k = 0; k < c->n_members; k++) {
        int i = pod_index(o, c->members[k].pod, c->members[k].lease);
        int r = c->members[k].rank;
        if (i < 0 || (o->gen_alive && r >= 0 && (size_t)r < c->n_members && o->gen_alive[r]) ||
            (o->has_status[i] && o->status[i].generation == c->generation &&
             o->status[i].state != EDL_TRAINER_RUNNING))
            continue;
        int64_t t = pod_ttl_ms(o, i);
        ttl_ms = t > ttl_ms ? t : ttl_ms;
    }
    return ttl_ms ? dead_since + ttl_ms + EDL_HOLD_MARGIN_MS : 0;
}

/* The first member or server of the current generation whose trainer could not be started
 * (copied into *f); false: none. */
static bool find_unstartable(const js_observed *o, const failure *fl, size_t nf, failure *f)
{
    const edl_generation *c = o->current;
    for (size_t k = 0; k < nf; k++)
        if (fl[k].unstartable) {
            *f = fl[k];
            return true;
        }
    for (size_t k = 0; k < c->n_servers; k++) {
        int i = pod_index(o, c->servers[k].pod, c->servers[k].lease);
        if (i >= 0 && server_ended(o, (size_t)i) && cannot_start(&o->status[i]))
            return describe_failure(&c->servers[k], "server", &o->status[i], f);
    }
    return false;
}

static const failure *first_permanent(const edl_job_spec *sp, const failure *fl, size_t nf)
{
    for (size_t i = 0; i < nf; i++)
        if (fl[i].code >= 0 && edl_exit_code_in(sp->permanent_codes, fl[i].code))
            return &fl[i];
    return NULL;
}

/* ---- the trainer's own bug (fail fast) --------------------------------------------------- */

/* The first failure the trainer marked as its own (edl.torch: an exception that is no
 * communication failure): restarting repeats it, whatever the mode. NULL: none. */
static const failure *marked_failure(const failure *fl, size_t nf)
{
    for (size_t k = 0; k < nf; k++)
        if (fl[k].marked)
            return &fl[k];
    return NULL;
}

/* The same rank failed the same way (exit code or signal, and message) in the generation
 * restarted last for its members' own failures. */
static bool repeats(const js_memory *m, int64_t gen, const failure *f)
{
    if (m->failed_gen <= 0 || m->failed_gen >= gen)
        return false;
    for (size_t i = 0; i < m->n_failed; i++)
        if (m->failed[i].rank == f->rank && m->failed[i].code == f->code &&
            m->failed[i].message_hash == f->message_hash)
            return true;
    return false;
}

/* The script's bug, judged once the failures are in (after any hold): every member of the
 * generation failed on its own (no peer was lost: js_reconcile dropped such failures), or one
 * rank failed exactly as in the last restarted generation. Either way a restart runs the same
 * program on the same input into the same failure, so the job fails now, its reason in buf.
 * Failures from outside (SIGKILL, SIGTERM, a hang) never count: they spend restarts as ever. */
static bool script_bug(const js_observed *o, const js_memory *m, const failure *fl, size_t nf,
                       char *buf, size_t len)
{
    const edl_generation *c = o->current;
    size_t own = 0;
    for (size_t k = 0; k < nf; k++)
        own += fl[k].own;
    if (nf && own == nf && nf == c->n_members) {
        snprintf(buf, len, "%s; every rank (%zu of %zu) failed by itself: the script's own "
                 "error (restarting would repeat it): fix it and run the job again", fl[0].what,
                 nf, c->n_members);
        return true;
    }
    for (size_t k = 0; k < nf; k++)
        if (fl[k].own && repeats(m, c->generation, &fl[k])) {
            snprintf(buf, len, "%s; rank %d failed the same way in generation %lld: the "
                     "script's own error (restarting would repeat it): fix it and run the job "
                     "again", fl[k].what, fl[k].rank, (long long)m->failed_gen);
            return true;
        }
    return false;
}

/* Remember the own failures of the generation being restarted, for the next judgement. */
static void remember_failures(js_memory *m, int64_t gen, const failure *fl, size_t nf)
{
    m->failed_gen = gen;
    m->n_failed = 0;
    for (size_t k = 0; k < nf && m->n_failed < JS_FAILURES_KEPT; k++)
        if (fl[k].own)
            m->failed[m->n_failed++] = (js_failure_sig){
                .rank = fl[k].rank, .code = fl[k].code, .message_hash = fl[k].message_hash};
}

/* A generation its trainers declared dead (their collective group broke) with nobody gone:
 * re-form with the same members. A grace of one settle window (at least 1 s) lets the usual
 * signals (a trainer's exit, a lease's expiry) arrive first and name the cause. True once it
 * is over; while it runs, *wake says when it ends. */
static bool declared_dead(const js_observed *o, js_memory *mem, int64_t *wake)
{
    const edl_generation *c = o->current;
    const edl_job_spec *sp = o->spec;
    if (!o->gen_dead || c->generation <= 0 || c->state != EDL_JOB_RUNNING || member_lost(o))
        return false;
    if (mem->dead_gen != c->generation) {
        mem->dead_gen = c->generation;
        mem->dead_since_mono_ms = o->mono_ms;
    }
    int64_t due = mem->dead_since_mono_ms + (sp->settle_ms > 1000 ? sp->settle_ms : 1000);
    int64_t silent = silent_until(o, mem->dead_since_mono_ms);
    if (silent > due)
        due = silent;
    if (o->mono_ms >= due)
        return true;
    if (!*wake || due < *wake)
        *wake = due;
    return false;
}

int js_reconcile(const js_observed *o, js_memory *mem, js_decision *out)
{
    memset(out, 0, sizeof *out);
    const edl_generation *c = o->current;
    const edl_job_spec *sp = o->spec;
    if (!sp)
        return 0;
    if (c->generation > 0 && edl_job_state_final(c->state))
        return 0;
    if (sp->stopped)
        return publish_final(o, EDL_JOB_STOPPED, "stopped on request", out);

    failure *fl = calloc(c->n_members + 1, sizeof *fl);
    if (!fl)
        return EDL_ENOMEM;
    bool all_done = false, finishing = false;
    int64_t wake = 0;
    char reason[REASON_MAX];
    size_t nf = collect_failures(o, mem, fl, &all_done, &finishing, &wake);
    finish fin = all_done ? FINISH_NONE
                          : rank0_finished(o, mem, fl, nf, reason, sizeof reason, &wake);
    if (fin == FINISH_WAIT) {
        out->wake_mono_ms = wake;
        free(fl);
        return 0;
    }
    /* A member vanished: the failures of the others are the fallout of its loss (a new
     * generation without it follows, costing no restart and blaming nobody). */
    if (nf && member_lost(o))
        nf = 0;
    /* A trainer that cannot be started fails the job at once: no hold, no restart. */
    failure bad;
    bool unstartable = !member_lost(o) && find_unstartable(o, fl, nf, &bad);
    /* A failure the trainer marked as its own is no peer's fallout: no hold either. */
    const failure *marked = sp->fail_fast ? marked_failure(fl, nf) : NULL; /* else: a failure */
    if (nf && !unstartable && !marked &&
        hold_for_silent_peers(o, mem, fl, nf, &wake, out)) {
        out->wake_mono_ms = wake;
        free(fl);
        return 0;
    }
    bool dead = nf == 0 && declared_dead(o, mem, &wake);
    int rc = 0;
    const failure *perm;
    if (fin == FINISH_NOW) {
        rc = publish_final(o, EDL_JOB_SUCCEEDED, reason, out);
    } else if (unstartable) {
        snprintf(reason, sizeof reason, "%s; the trainer cannot be started (not found or not "
                 "executable): fix the command; the job fails without restarts", bad.what);
        rc = publish_final(o, EDL_JOB_FAILED, reason, out);
    } else if (marked) {
        snprintf(reason, sizeof reason, "%s; the trainer's own error (not a communication "
                 "failure): restarting would repeat it, the job fails: fix the script and run "
                 "the job again", marked->what);
        rc = publish_final(o, EDL_JOB_FAILED, reason, out);
    } else if (all_done) {
        snprintf(reason, sizeof reason, "all %zu ranks exited 0", c->n_members);
        rc = publish_final(o, EDL_JOB_SUCCEEDED, reason, out);
    } else if (nf && sp->restart_policy == EDL_RESTART_NEVER) {
        snprintf(reason, sizeof reason, "%s; restart policy is Never", fl[0].what);
        rc = publish_final(o, EDL_JOB_FAILED, reason, out);
    } else if (nf && sp->restart_policy == EDL_RESTART_EXIT_CODE &&
               (perm = first_permanent(sp, fl, nf)) != NULL) {
        snprintf(reason, sizeof reason, "%s, a permanent exit code", perm->what);
        rc = publish_final(o, EDL_JOB_FAILED, reason, out);
    } else if (nf && sp->fail_fast && script_bug(o, mem, fl, nf, reason, sizeof reason)) {
        rc = publish_final(o, EDL_JOB_FAILED, reason, out);
    } else if (nf && c->restarts + 1 > sp->max_restarts) {
        snprintf(reason, sizeof reason, "restart budget of %d spent; last failure: %s",
                 sp->max_restarts, fl[0].what);
        rc = publish_final(o, EDL_JOB_FAILED, reason, out);
    } else if (dead && c->restarts + 1 > sp->max_restarts) {
        snprintf(reason, sizeof reason, "restart budget of %d spent; generation %lld declared "
                 "dead: %.200s", sp->max_restarts, (long long)c->generation, o->gen_dead);
        rc = publish_final(o, EDL_JOB_FAILED, reason, out);
    } else {
        if (nf)
            remember_failures(mem, c->generation, fl, nf);
        rc = reconcile_membership(o, mem, fl, nf, dead, finishing, out);
    }
    if (wake && (!out->wake_mono_ms || wake < out->wake_mono_ms))
        out->wake_mono_ms = wake;
    free(fl);
    if (rc)
        js_decision_clear(out);
    return rc;
}
