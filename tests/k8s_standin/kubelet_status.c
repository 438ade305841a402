/* kubelet_status.c: the pod status the stand-in kubelet writes (through /status, as a normal
 * write: new resourceVersion, MODIFIED event): phase, the PodScheduled, Initialized,
 * ContainersReady and Ready conditions, podIP/hostIP 127.0.0.1, startTime, and a status per
 * (init) container with its state (waiting, running, terminated), lastState and restartCount. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kubelet.h"

static void add_time(cJSON *o, const char *key, time_t t)
{
    char buf[32];
    cJSON_AddStringToObject(o, key, si_rfc3339(t, buf));
}

static cJSON *condition(const char *type, bool status, time_t t, const char *reason)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", type);
    cJSON_AddStringToObject(c, "status", status ? "True" : "False");
    cJSON_AddNullToObject(c, "lastProbeTime");
    add_time(c, "lastTransitionTime", t ? t : time(NULL));
    if (reason)
        cJSON_AddStringToObject(c, "reason", reason);
    return c;
}

static cJSON *terminated(int code, const char *reason, const char *message, time_t started,
                         time_t finished)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "exitCode", code);
    cJSON_AddStringToObject(t, "reason", reason);
    if (message && *message)
        cJSON_AddStringToObject(t, "message", message);
    add_time(t, "startedAt", started);
    add_time(t, "finishedAt", finished);
    return t;
}

static cJSON *state_of(const kcont *c, const char *default_wait)
{
    cJSON *s = cJSON_CreateObject();
    if (c->state == KC_RUNNING) {
        add_time(cJSON_AddObjectToObject(s, "running"), "startedAt", c->started);
    } else if (c->state == KC_TERMINATED) {
        cJSON_AddItemToObject(s, "terminated", terminated(c->exit_code, c->reason, c->message,
                                                          c->started, c->finished));
    } else {
        cJSON *w = cJSON_AddObjectToObject(s, "waiting");
        cJSON_AddStringToObject(w, "reason", c->reason[0] ? c->reason : default_wait);
        if (c->message[0])
            cJSON_AddStringToObject(w, "message", c->message);
    }
    return s;
}

static cJSON *container_status(const kpod *kp, const kcont *c, const char *default_wait)
{
    const cJSON *x;
    const char *image = "";
    cJSON_ArrayForEach(x, si_get(kp->pod, c->init ? "spec.initContainers" : "spec.containers"))
    {
        if (si_str(x, "name") && !strcmp(si_str(x, "name"), c->name) && si_str(x, "image"))
            image = si_str(x, "image");
    }
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "name", c->name);
    cJSON_AddItemToObject(s, "state", state_of(c, default_wait));
    cJSON *last = cJSON_AddObjectToObject(s, "lastState");
    if (c->has_last)
        cJSON_AddItemToObject(last, "terminated", terminated(c->last_exit, c->last_reason, NULL,
                                                             c->last_started, c->last_finished));
    cJSON_AddBoolToObject(s, "ready", c->state == KC_RUNNING && !c->init);
    cJSON_AddNumberToObject(s, "restartCount", c->restarts);
    cJSON_AddStringToObject(s, "image", image);
    cJSON_AddStringToObject(s, "imageID", "");
    if (c->started) {
        char id[160];
        snprintf(id, sizeof id, "standin://%s-%s-%d", kp->uid, c->name, c->restarts);
        cJSON_AddStringToObject(s, "containerID", id);
    }
    cJSON_AddBoolToObject(s, "started", c->state == KC_RUNNING);
    return s;
}

static cJSON *ips(void)
{
    cJSON *a = cJSON_CreateArray(), *ip = cJSON_CreateObject();
    cJSON_AddStringToObject(ip, "ip", "127.0.0.1");
    cJSON_AddItemToArray(a, ip);
    return a;
}

cJSON *kl_build_status(const kpod *kp)
{
    cJSON *st = cJSON_CreateObject(), *conds = cJSON_CreateArray();
    bool done = kp->stage == KP_DONE || !strcmp(kp->phase, "Succeeded") || !strcmp(kp->phase, "Failed");
    bool inited = kp->stage >= KP_MAIN;
    cJSON_AddStringToObject(st, "phase", kp->phase);
    cJSON_AddItemToArray(conds, condition("PodReadyToStartContainers", kp->stage > KP_VOLUMES && !done, kp->t_scheduled, NULL));
    cJSON_AddItemToArray(conds, condition("Initialized", inited, inited ? kp->t_initialized : kp->t_scheduled,
                                          inited ? NULL : "ContainersNotInitialized"));
    const char *why = done ? "PodCompleted" : kp->ready ? NULL : "ContainersNotReady";
    cJSON_AddItemToArray(conds, condition("Ready", kp->ready, kp->t_ready ? kp->t_ready : kp->t_scheduled, why));
    cJSON_AddItemToArray(conds, condition("ContainersReady", kp->ready, kp->t_ready ? kp->t_ready : kp->t_scheduled, why));
    cJSON_AddItemToArray(conds, condition("PodScheduled", true, kp->t_scheduled, NULL));
    cJSON_AddItemToObject(st, "conditions", conds);
    cJSON_AddStringToObject(st, "hostIP", "127.0.0.1");
    cJSON_AddItemToObject(st, "hostIPs", ips());
    if (kp->stage > KP_VOLUMES) {
        cJSON_AddStringToObject(st, "podIP", "127.0.0.1");
        cJSON_AddItemToObject(st, "podIPs", ips());
    }
    add_time(st, "startTime", kp->start_time);
    if (kp->n_init) {
        cJSON *a = cJSON_AddArrayToObject(st, "initContainerStatuses");
        for (int i = 0; i < kp->n_init; i++)
            cJSON_AddItemToArray(a, container_status(kp, &kp->init[i], "PodInitializing"));
    }
    cJSON *a = cJSON_AddArrayToObject(st, "containerStatuses");
    for (int i = 0; i < kp->n_main; i++)
        cJSON_AddItemToArray(a, container_status(kp, &kp->main[i], kp->stage == KP_INIT ? "PodInitializing" : "ContainerCreating"));
    cJSON_AddStringToObject(st, "qosClass", "BestEffort");
    return st;
}

void kl_write_status(si_server *srv, kpod *kp)
{
    si_store *s = &srv->store;
    kp->dirty = false;
    pthread_mutex_lock(&s->mu);
    si_resource *pods = si_builtin(s, "", "pods");
    si_obj *cur = si_store_get(s, pods, kp->ns, kp->name);
    const char *uid = cur ? si_str(cur->json, "metadata.uid") : NULL;
    if (uid && !strcmp(uid, kp->uid)) {
        cJSON *body = cJSON_Duplicate(cur->json, true);
        cJSON_DeleteItemFromObjectCaseSensitive(body, "status");
        cJSON_AddItemToObject(body, "status", kl_build_status(kp));
        si_result res = si_update(srv, pods, kp->ns, kp->name, "status", body, NULL);
        si_result_free(&res);
    }
    pthread_mutex_unlock(&s->mu);
}
