/* kubelet.c: the stand-in kubelet, one thread: it watches pods through the store (an internal
 * watch, no HTTP), binds every pod without spec.nodeName to standin-node, and (process mode)
 * runs init containers one after another, then every container as a local process
 * (kubelet_exec.c), restarts them by restartPolicy, reaps them with waitpid, writes the pod's
 * status on every change (kubelet_status.c), and on deletion sends SIGTERM to each container's
 * process group, SIGKILL after the grace period, then removes the pod. Phase-only mode runs
 * nothing: a new pod goes straight to Running. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kubelet.h"

int64_t kl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static si_resource *pods_of(si_server *srv)
{
    return si_builtin(&srv->store, "", "pods");
}

/* spec.nodeName = standin-node: the scheduler's binding, as a normal write. */
static void bind_pod(si_server *srv, const cJSON *pod)
{
    const char *ns = si_str(pod, "metadata.namespace"), *name = si_str(pod, "metadata.name");
    pthread_mutex_lock(&srv->store.mu);
    si_obj *cur = si_store_get(&srv->store, pods_of(srv), ns, name);
    if (cur && !si_str(cur->json, "spec.nodeName") &&
        !strcmp(si_str(cur->json, "metadata.uid"), si_str(pod, "metadata.uid"))) {
        cJSON *body = cJSON_Duplicate(cur->json, true);
        si_set_str(si_obj_child(body, "spec"), "nodeName", SI_NODE_NAME);
        si_result res = si_update(srv, pods_of(srv), ns, name, NULL, body, NULL);
        si_result_free(&res);
    }
    pthread_mutex_unlock(&srv->store.mu);
}

static kpod *find_pod(si_kubelet *k, const char *uid)
{
    for (kpod *p = k->pods; p; p = p->next)
        if (!strcmp(p->uid, uid))
            return p;
    return NULL;
}

static kcont *containers_of(const cJSON *list, int *n, bool init)
{
    *n = cJSON_GetArraySize(list);
    kcont *c = calloc((size_t)*n + 1, sizeof *c);
    const cJSON *x;
    int i = 0;
    cJSON_ArrayForEach(x, list)
    {
        snprintf(c[i].name, sizeof c[i].name, "%s", si_str(x, "name") ? si_str(x, "name") : "");
        c[i].init = init;
        c[i++].state = KC_WAITING;
    }
    return c;
}

static kpod *new_pod(si_kubelet *k, const cJSON *pod)
{
    kpod *kp = calloc(1, sizeof *kp);
    snprintf(kp->ns, sizeof kp->ns, "%s", si_str(pod, "metadata.namespace"));
    snprintf(kp->name, sizeof kp->name, "%s", si_str(pod, "metadata.name"));
    snprintf(kp->uid, sizeof kp->uid, "%s", si_str(pod, "metadata.uid"));
    snprintf(kp->dir, sizeof kp->dir, "%s/%s_%s_%s", k->srv->cfg.kubelet_root, kp->ns, kp->name, kp->uid);
    kp->pod = cJSON_Duplicate(pod, true);
    kp->init = containers_of(si_get(pod, "spec.initContainers"), &kp->n_init, true);
    kp->main = containers_of(si_get(pod, "spec.containers"), &kp->n_main, false);
    kp->stage = KP_VOLUMES;
    snprintf(kp->phase, sizeof kp->phase, "Pending");
    kp->start_time = kp->t_scheduled = time(NULL);
    kp->dirty = true;
    kp->next = k->pods;
    k->pods = kp;
    return kp;
}

static void free_pod(si_kubelet *k, kpod *kp)
{
    for (kpod **pp = &k->pods; *pp; pp = &(*pp)->next)
        if (*pp == kp) {
            *pp = kp->next;
            break;
        }
    cJSON_Delete(kp->pod);
    free(kp->init);
    free(kp->main);
    free(kp);
}

static void signal_all(kpod *kp, int sig)
{
    for (int i = 0; i < kp->n_init; i++)
        if (kp->init[i].pid > 0)
            kill(-kp->init[i].pid, sig);
    for (int i = 0; i < kp->n_main; i++)
        if (kp->main[i].pid > 0)
            kill(-kp->main[i].pid, sig);
}

static bool any_running(const kpod *kp)
{
    for (int i = 0; i < kp->n_init; i++)
        if (kp->init[i].pid > 0)
            return true;
    for (int i = 0; i < kp->n_main; i++)
        if (kp->main[i].pid > 0)
            return true;
    return false;
}

static void start_deleting(kpod *kp, const cJSON *pod)
{
    const cJSON *g = si_get(pod, "metadata.deletionGracePeriodSeconds");
    kp->deleting = true;
    kp->kill_at_ms = kl_now_ms() + (cJSON_IsNumber(g) ? (int64_t)g->valuedouble * 1000 : 30000);
    for (int i = 0; i < kp->n_main; i++)
        kp->main[i].start_at_ms = 0;
    for (int i = 0; i < kp->n_init; i++)
        kp->init[i].start_at_ms = 0;
    signal_all(kp, SIGTERM);
}

/* Phase-only: straight to Running, no processes. */
static void phase_only(si_kubelet *k, const cJSON *pod)
{
    const char *phase = si_str(pod, "status.phase");
    if (si_get(pod, "metadata.deletionTimestamp") || (phase && strcmp(phase, "Pending")))
        return;
    if (!si_str(pod, "spec.nodeName")) {
        bind_pod(k->srv, pod);
        return; /* the binding's own event brings the pod back here */
    }
    kpod kp = {0};
    kcont *main = containers_of(si_get(pod, "spec.containers"), &kp.n_main, false);
    snprintf(kp.ns, sizeof kp.ns, "%s", si_str(pod, "metadata.namespace"));
    snprintf(kp.name, sizeof kp.name, "%s", si_str(pod, "metadata.name"));
    snprintf(kp.uid, sizeof kp.uid, "%s", si_str(pod, "metadata.uid"));
    kp.pod = (cJSON *)pod;
    kp.main = main;
    kp.stage = KP_MAIN;
    snprintf(kp.phase, sizeof kp.phase, "Running");
    kp.start_time = kp.t_scheduled = kp.t_initialized = kp.t_ready = time(NULL);
    kp.ready = true;
    for (int i = 0; i < kp.n_main; i++) {
        main[i].state = KC_RUNNING;
        main[i].started = kp.start_time;
    }
    kl_write_status(k->srv, &kp);
    free(main);
}

static void on_event(si_kubelet *k, si_event *e)
{
    const cJSON *pod = e->obj->json;
    const char *uid = si_str(pod, "metadata.uid"), *phase = si_str(pod, "status.phase");
    if (!uid)
        return;
    if (k->srv->cfg.kubelet_mode == SI_KUBELET_PHASE_ONLY) {
        if (e->type != SI_DELETED)
            phase_only(k, pod);
        return;
    }
    kpod *kp = find_pod(k, uid);
    if (e->type == SI_DELETED) {
        if (kp) { /* removed at once (grace 0, force): no grace left */
            signal_all(kp, SIGKILL);
            kp->deleting = true;
            kp->kill_at_ms = 0;
            kp->stage = KP_DONE;
            snprintf(kp->phase, sizeof kp->phase, "Gone");
        }
        return;
    }
    bool terminal = phase && (!strcmp(phase, "Succeeded") || !strcmp(phase, "Failed"));
    if (!kp && !terminal && !si_get(pod, "metadata.deletionTimestamp")) {
        if (!si_str(pod, "spec.nodeName")) {
            bind_pod(k->srv, pod);
            return;
        }
        kp = new_pod(k, pod);
    }
    if (kp && si_get(pod, "metadata.deletionTimestamp") && !kp->deleting)
        start_deleting(kp, pod);
}

static bool should_restart(const kpod *kp, const kcont *c)
{
    const char *policy = si_str(kp->pod, "spec.restartPolicy");
    if (!policy || !strcmp(policy, "Always"))
        return !c->init || c->exit_code != 0;
    if (!strcmp(policy, "OnFailure"))
        return c->exit_code != 0;
    return false;
}

/* A reaped process: its container terminated, maybe to be restarted after a back-off. */
static void on_exit_status(kpod *kp, kcont *c, int status)
{
    c->pid = 0;
    c->state = KC_TERMINATED;
    c->finished = time(NULL);
    c->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    snprintf(c->reason, sizeof c->reason, "%s", c->exit_code == 0 ? "Completed" : "Error");
    c->message[0] = '\0';
    kp->dirty = true;
    if (!kp->deleting && should_restart(kp, c)) {
        int shift = c->restarts < 6 ? c->restarts : 6;
        c->start_at_ms = kl_now_ms() + (100LL << shift); /* 0.1 s doubling, at most 6.4 s */
    }
}

static void reap(si_kubelet *k)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (kpod *kp = k->pods; kp; kp = kp->next) {
            for (int i = 0; i < kp->n_init + kp->n_main; i++) {
                kcont *c = i < kp->n_init ? &kp->init[i] : &kp->main[i - kp->n_init];
                if (c->pid == pid)
                    on_exit_status(kp, c, status);
            }
        }
    }
}

/* (Re)start c now; a restart keeps the last termination as lastState. */
static void start(si_kubelet *k, kpod *kp, kcont *c)
{
    if (c->state == KC_TERMINATED) {
        c->has_last = true;
        c->last_exit = c->exit_code;
        snprintf(c->last_reason, sizeof c->last_reason, "%s", c->reason);
        c->last_started = c->started;
        c->last_finished = c->finished;
        c->restarts++;
    }
    c->start_at_ms = 0;
    if (kl_start_container(k->srv, kp, c) && c->state == KC_WAITING)
        c->start_at_ms = kl_now_ms() + 1000; /* a config error: try again in a second */
    else if (c->state == KC_TERMINATED && !kp->deleting && should_restart(kp, c))
        c->start_at_ms = kl_now_ms() + 1000;
    kp->dirty = true;
}

static void run_init(si_kubelet *k, kpod *kp, int64_t now)
{
    while (kp->stage == KP_INIT) {
        if (kp->init_index == kp->n_init) {
            kp->stage = KP_MAIN;
            kp->t_initialized = time(NULL);
            kp->dirty = true;
            break;
        }
        kcont *c = &kp->init[kp->init_index];
        if (c->state == KC_WAITING && (!c->start_at_ms || now >= c->start_at_ms) && !c->pid)
            start(k, kp, c);
        else if (c->state == KC_TERMINATED && c->exit_code == 0)
            kp->init_index++;
        else if (c->state == KC_TERMINATED && c->start_at_ms && now >= c->start_at_ms)
            start(k, kp, c);
        else if (c->state == KC_TERMINATED && !c->start_at_ms) {
            kp->stage = KP_DONE; /* a failed init container under restartPolicy Never */
            snprintf(kp->phase, sizeof kp->phase, "Failed");
            kp->dirty = true;
        } else {
            break;
        }
    }
}

static void run_main(si_kubelet *k, kpod *kp, int64_t now)
{
    bool all_done = true, all_zero = true, all_running = true;
    for (int i = 0; i < kp->n_main; i++) {
        kcont *c = &kp->main[i];
        if (c->pid == 0 && (c->state == KC_WAITING || c->start_at_ms) &&
            (!c->start_at_ms || now >= c->start_at_ms))
            start(k, kp, c);
        all_done &= c->state == KC_TERMINATED && !c->start_at_ms;
        all_zero &= c->exit_code == 0;
        all_running &= c->state == KC_RUNNING;
    }
    bool ready = all_running && kp->n_main > 0;
    if (ready != kp->ready) {
        kp->ready = ready;
        kp->t_ready = time(NULL);
        kp->dirty = true;
    }
    const char *phase = all_done ? (all_zero ? "Succeeded" : "Failed") : "Running";
    bool started = false;
    for (int i = 0; i < kp->n_main; i++)
        started |= kp->main[i].started != 0;
    if (!started && !all_done)
        phase = "Pending";
    if (strcmp(kp->phase, phase)) {
        snprintf(kp->phase, sizeof kp->phase, "%s", phase);
        kp->dirty = true;
    }
    if (all_done)
        kp->stage = KP_DONE;
}

static void prepare(si_kubelet *k, kpod *kp, int64_t now)
{
    char err[500];
    if (now < kp->volumes_at_ms)
        return;
    if (kl_prepare_volumes(k->srv, kp, err, sizeof err)) {
        for (int i = 0; i < kp->n_main; i++)
            if (strcmp(kp->main[i].message, err)) {
                snprintf(kp->main[i].reason, sizeof kp->main[i].reason, "ContainerCreating");
                snprintf(kp->main[i].message, sizeof kp->main[i].message, "%s", err);
                kp->dirty = true;
            }
        kp->volumes_at_ms = now + 1000;
        return;
    }
    for (int i = 0; i < kp->n_main; i++)
        kp->main[i].reason[0] = kp->main[i].message[0] = '\0';
    kp->stage = kp->n_init ? KP_INIT : KP_MAIN;
    if (kp->stage == KP_MAIN)
        kp->t_initialized = time(NULL);
    kp->dirty = true;
}

/* Deleting: SIGKILL once the grace is over; when nothing runs, the final status and the
 * removal (a delete with grace 0, as the real kubelet does). */
static void finish_deleting(si_kubelet *k, kpod *kp, int64_t now)
{
    if (any_running(kp)) {
        if (kp->kill_at_ms && now >= kp->kill_at_ms) {
            signal_all(kp, SIGKILL);
            kp->kill_at_ms = 0;
        }
        return;
    }
    if (strcmp(kp->phase, "Gone")) {
        bool zero = true;
        for (int i = 0; i < kp->n_main; i++)
            zero &= kp->main[i].state == KC_TERMINATED && kp->main[i].exit_code == 0;
        if (strcmp(kp->phase, "Succeeded") && strcmp(kp->phase, "Failed"))
            snprintf(kp->phase, sizeof kp->phase, "%s", zero ? "Succeeded" : "Failed");
        kp->ready = false;
        kp->stage = KP_DONE;
        kl_write_status(k->srv, kp);
        pthread_mutex_lock(&k->srv->store.mu);
        si_delete_opts o = {.grace = 0};
        si_obj *cur = si_store_get(&k->srv->store, pods_of(k->srv), kp->ns, kp->name);
        if (cur && !strcmp(si_str(cur->json, "metadata.uid"), kp->uid)) {
            si_result res = si_delete(k->srv, pods_of(k->srv), kp->ns, kp->name, &o);
            si_result_free(&res);
        }
        pthread_mutex_unlock(&k->srv->store.mu);
    }
    free_pod(k, kp);
}

static void tick(si_kubelet *k)
{
    int64_t now = kl_now_ms();
    for (kpod *kp = k->pods, *next; kp; kp = next) {
        next = kp->next;
        if (kp->deleting) {
            finish_deleting(k, kp, now);
            continue;
        }
        if (kp->stage == KP_VOLUMES)
            prepare(k, kp, now);
        if (kp->stage == KP_INIT)
            run_init(k, kp, now);
        if (kp->stage == KP_MAIN)
            run_main(k, kp, now);
        if (kp->dirty)
            kl_write_status(k->srv, kp);
    }
}

static void wait_for_work(si_watch *w, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    if (!w->head)
        pthread_cond_timedwait(&w->cond, &w->mu, &ts);
    pthread_mutex_unlock(&w->mu);
}

/* Shutdown: SIGTERM to every pod process, SIGKILL to what is left after 2 s. */
static void kill_everything(si_kubelet *k)
{
    for (kpod *kp = k->pods; kp; kp = kp->next)
        signal_all(kp, SIGTERM);
    int64_t until = kl_now_ms() + 2000;
    bool left = true;
    while (left && kl_now_ms() < until) {
        reap(k);
        left = false;
        for (kpod *kp = k->pods; kp; kp = kp->next)
            left |= any_running(kp);
        if (left)
            usleep(20000);
    }
    for (kpod *kp = k->pods; kp; kp = kp->next)
        signal_all(kp, SIGKILL);
    while (k->pods) {
        for (int i = 0; i < k->pods->n_init + k->pods->n_main; i++) {
            kcont *c = i < k->pods->n_init ? &k->pods->init[i] : &k->pods->main[i - k->pods->n_init];
            if (c->pid > 0)
                waitpid(c->pid, NULL, 0);
        }
        free_pod(k, k->pods);
    }
}

static void *kubelet_main(void *arg)
{
    si_kubelet *k = arg;
    while (!k->stop) {
        si_event *e;
        while ((e = si_watch_pop(&k->w))) {
            on_event(k, e);
            si_event_unref(e);
        }
        reap(k);
        tick(k);
        wait_for_work(&k->w, 50);
    }
    kill_everything(k);
    return NULL;
}

si_kubelet *si_kubelet_start(si_server *srv)
{
    si_kubelet *k = calloc(1, sizeof *k);
    k->srv = srv;
    k->w.res = pods_of(srv);
    pthread_mutex_lock(&srv->store.mu);
    si_watch_start(&srv->store, &k->w, 0, true, 0);
    pthread_mutex_unlock(&srv->store.mu);
    if (pthread_create(&k->thread, NULL, kubelet_main, k)) {
        fprintf(stderr, "k8s-standin: cannot start the kubelet thread\n");
        exit(1);
    }
    return k;
}

void si_kubelet_stop(si_kubelet *k)
{
    if (!k)
        return;
    k->stop = 1;
    pthread_mutex_lock(&k->w.mu);
    pthread_cond_broadcast(&k->w.cond);
    pthread_mutex_unlock(&k->w.mu);
    pthread_join(k->thread, NULL);
    pthread_mutex_lock(&k->srv->store.mu);
    si_watch_stop(&k->srv->store, &k->w);
    pthread_mutex_unlock(&k->srv->store.mu);
    pthread_mutex_destroy(&k->w.mu);
    pthread_cond_destroy(&k->w.cond);
    free(k);
}

char *si_kubelet_log(si_server *srv, const cJSON *pod, const char *container, size_t *len)
{
    char path[PATH_MAX];
    const char *name = *container ? container : si_str(pod, "spec.containers[0].name");
    if (!srv->cfg.kubelet_root || !name ||
        snprintf(path, sizeof path, "%s/%s_%s_%s/%s.log", srv->cfg.kubelet_root,
                 si_str(pod, "metadata.namespace"), si_str(pod, "metadata.name"),
                 si_str(pod, "metadata.uid"), name) >= (int)sizeof path)
        return NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            if (cap >= SI_MAX_BODY * 4)
                break;
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    fclose(f);
    *len = n;
    return buf;
}
