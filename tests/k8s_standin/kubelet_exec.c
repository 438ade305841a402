/* kubelet_exec.c: how the stand-in kubelet turns a container into a local process (its
 * volumes are kubelet_volumes.c's directories): the environment (the kubelet's PATH and HOME,
 * then envFrom and env with value, fieldRef, secretKeyRef, configMapKeyRef and $(VAR)
 * expansion), command + args with $(VAR) expansion, and the rewrite of paths under a volume's
 * mountPath to the volume's host directory (there is no chroot), then fork/exec in a new
 * process group with stdout and stderr in <pod dir>/<container>.log. */
#define _GNU_SOURCE /* close_range, execvpe */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kubelet.h"

typedef struct envlist {
    char **kv; /* "NAME=value" */
    int n, cap;
} envlist;

typedef struct mounts {
    char path[32][PATH_MAX], host[32][PATH_MAX];
    int n;
} mounts;

static const char *env_get(const envlist *e, const char *name, size_t len)
{
    for (int i = e->n - 1; i >= 0; i--)
        if (!strncmp(e->kv[i], name, len) && e->kv[i][len] == '=')
            return e->kv[i] + len + 1;
    return NULL;
}

static void env_set(envlist *e, const char *name, const char *value)
{
    size_t len = strlen(name);
    char *kv = malloc(len + strlen(value) + 2);
    sprintf(kv, "%s=%s", name, value);
    for (int i = 0; i < e->n; i++)
        if (!strncmp(e->kv[i], name, len) && e->kv[i][len] == '=') {
            free(e->kv[i]);
            e->kv[i] = kv;
            return;
        }
    if (e->n + 2 > e->cap) {
        e->cap = e->cap ? e->cap * 2 : 16;
        e->kv = realloc(e->kv, (size_t)e->cap * sizeof *e->kv);
    }
    e->kv[e->n++] = kv;
    e->kv[e->n] = NULL;
}

static void env_free(envlist *e)
{
    for (int i = 0; i < e->n; i++)
        free(e->kv[i]);
    free(e->kv);
}

/* Kubernetes' $(VAR) expansion: $$ is a literal $, $(NAME) the variable when it is defined
 * (else left as written). */
static char *expand(const char *s, const envlist *e)
{
    size_t cap = strlen(s) + 64, n = 0;
    char *out = malloc(cap);
    for (const char *p = s; *p;) {
        const char *val = NULL, *end = NULL;
        size_t vlen = 1;
        if (p[0] == '$' && p[1] == '$') {
            val = "$";
            end = p + 2;
        } else if (p[0] == '$' && p[1] == '(' && (end = strchr(p + 2, ')'))) {
            val = env_get(e, p + 2, (size_t)(end - p - 2));
            if (!val) {
                val = p;
                vlen = (size_t)(end - p + 1);
            }
            end++;
        }
        if (!val) {
            val = p;
            end = p + 1;
        } else if (val != p) {
            vlen = strlen(val);
        }
        if (n + vlen + 1 > cap) {
            cap = (n + vlen + 1) * 2;
            out = realloc(out, cap);
        }
        memcpy(out + n, val, vlen);
        n += vlen;
        p = end;
    }
    out[n] = '\0';
    return out;
}

static bool path_end(char c)
{
    return c == '\0' || c == '/' || strchr(" \t\n'\";:,)|&<>", c) != NULL;
}

/* The mount (longest path first) whose mountPath starts at s, or -1. */
static int mount_at(const char *s, const mounts *m)
{
    for (int i = 0; i < m->n; i++) {
        size_t len = strlen(m->path[i]);
        if (!strncmp(s, m->path[i], len) && path_end(s[len]))
            return i;
    }
    return -1;
}

/* A path under a mountPath becomes the same path under the volume's host directory: at the
 * start of the string, or after a space, '=', ':', a quote or '(' (so shell commands and
 * --flag=/path work too). Takes s. */
static char *rewrite(char *s, const mounts *m)
{
    size_t cap = strlen(s) + 1, n = 0;
    char *out = malloc(cap);
    for (const char *p = s; *p;) {
        int i = (p == s || strchr(" \t='\":(", p[-1])) ? mount_at(p, m) : -1;
        const char *add = i >= 0 ? m->host[i] : p;
        size_t len = i >= 0 ? strlen(m->host[i]) : 1;
        if (n + len + 1 > cap) {
            cap = (n + len + 1) * 2;
            out = realloc(out, cap);
        }
        memcpy(out + n, add, len);
        n += len;
        p += i >= 0 ? strlen(m->path[i]) : 1;
    }
    out[n] = '\0';
    free(s);
    return out;
}

static const cJSON *container_spec(const kpod *kp, const kcont *c)
{
    const cJSON *x;
    cJSON_ArrayForEach(x, si_get(kp->pod, c->init ? "spec.initContainers" : "spec.containers"))
        if (si_str(x, "name") && !strcmp(si_str(x, "name"), c->name)) return x;
    return NULL;
}

static void volume_mounts(const kpod *kp, const cJSON *spec, mounts *m)
{
    const cJSON *vm, *vol;
    m->n = 0;
    cJSON_ArrayForEach(vm, cJSON_GetObjectItem(spec, "volumeMounts"))
    {
        const char *name = si_str(vm, "name"), *mp = si_str(vm, "mountPath"), *sub = si_str(vm, "subPath");
        if (!name || !mp || m->n == 32)
            continue;
        cJSON_ArrayForEach(vol, si_get(kp->pod, "spec.volumes"))
        {
            if (!si_str(vol, "name") || strcmp(si_str(vol, "name"), name))
                continue;
            const char *hp = si_str(vol, "hostPath.path");
            char host[PATH_MAX];
            if (hp)
                snprintf(host, sizeof host, "%s", hp);
            else if (snprintf(host, sizeof host, "%s/volumes/%s", kp->dir, name) >= (int)sizeof host)
                break;
            if (snprintf(m->host[m->n], PATH_MAX, "%s%s%s", host, sub && *sub ? "/" : "",
                         sub ? sub : "") >= PATH_MAX)
                break;
            snprintf(m->path[m->n], PATH_MAX, "%s", mp);
            size_t len = strlen(m->path[m->n]);
            while (len > 1 && m->path[m->n][len - 1] == '/')
                m->path[m->n][--len] = '\0';
            m->n++;
            break;
        }
    }
    /* the longest mountPath first, so /data/x wins over /data */
    for (int i = 0; i < m->n; i++)
        for (int j = i + 1; j < m->n; j++)
            if (strlen(m->path[j]) > strlen(m->path[i])) {
                char t[PATH_MAX];
                memcpy(t, m->path[i], PATH_MAX), memcpy(m->path[i], m->path[j], PATH_MAX), memcpy(m->path[j], t, PATH_MAX);
                memcpy(t, m->host[i], PATH_MAX), memcpy(m->host[i], m->host[j], PATH_MAX), memcpy(m->host[j], t, PATH_MAX);
            }
}

/* The value of one valueFrom (store mutex held); NULL with err set when it cannot be had. */
static char *value_from(si_server *srv, const kpod *kp, const cJSON *vf, char *err, size_t errlen)
{
    const char *fp = si_str(vf, "fieldRef.fieldPath");
    if (fp) {
        if (!strcmp(fp, "status.podIP") || !strcmp(fp, "status.hostIP"))
            return strdup("127.0.0.1");
        if (!strcmp(fp, "spec.nodeName"))
            return strdup(SI_NODE_NAME);
        const cJSON *v = si_get(kp->pod, fp);
        return strdup(cJSON_IsString(v) ? v->valuestring : "");
    }
    bool secret = cJSON_GetObjectItem(vf, "secretKeyRef") != NULL;
    const cJSON *ref = cJSON_GetObjectItem(vf, secret ? "secretKeyRef" : "configMapKeyRef");
    if (!ref) {
        snprintf(err, errlen, "k8s-standin supports valueFrom fieldRef, secretKeyRef and "
                              "configMapKeyRef only");
        return NULL;
    }
    const char *name = si_str(ref, "name"), *key = si_str(ref, "key");
    bool optional = cJSON_IsTrue(cJSON_GetObjectItem(ref, "optional"));
    si_resource *r = si_builtin(&srv->store, "", secret ? "secrets" : "configmaps");
    si_obj *o = name ? si_store_get(&srv->store, r, kp->ns, name) : NULL;
    const cJSON *v = o && key ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(o->json, "data"), key) : NULL;
    if (!cJSON_IsString(v)) {
        if (optional)
            return strdup("");
        if (!o)
            snprintf(err, errlen, "%s \"%s\" not found", secret ? "secret" : "configmap", name ? name : "");
        else
            snprintf(err, errlen, "couldn't find key %s in %s %s/%s", key ? key : "",
                     secret ? "Secret" : "ConfigMap", kp->ns, name);
        return NULL;
    }
    if (!secret)
        return strdup(v->valuestring);
    size_t len;
    return (char *)si_base64_decode(v->valuestring, &len);
}

static int env_from(si_server *srv, const kpod *kp, const cJSON *spec, envlist *e, char *err,
                    size_t errlen)
{
    const cJSON *src, *kv;
    cJSON_ArrayForEach(src, cJSON_GetObjectItem(spec, "envFrom"))
    {
        bool secret = cJSON_GetObjectItem(src, "secretRef") != NULL;
        const cJSON *ref = cJSON_GetObjectItem(src, secret ? "secretRef" : "configMapRef");
        const char *name = si_str(ref, "name"), *prefix = si_str(src, "prefix");
        si_obj *o = name ? si_store_get(&srv->store, si_builtin(&srv->store, "", secret ? "secrets" : "configmaps"), kp->ns, name) : NULL;
        if (!o) {
            if (cJSON_IsTrue(cJSON_GetObjectItem(ref, "optional")))
                continue;
            snprintf(err, errlen, "%s \"%s\" not found", secret ? "secret" : "configmap", name ? name : "");
            return -1;
        }
        cJSON_ArrayForEach(kv, cJSON_GetObjectItem(o->json, "data"))
        {
            char full[512];
            size_t len;
            snprintf(full, sizeof full, "%s%s", prefix ? prefix : "", kv->string);
            char *val = secret ? (char *)si_base64_decode(kv->valuestring, &len) : strdup(kv->valuestring);
            env_set(e, full, val ? val : "");
            free(val);
        }
    }
    return 0;
}

/* The container's environment (store mutex held). */
static int build_env(si_server *srv, const kpod *kp, const cJSON *spec, const mounts *m,
                     envlist *e, char *err, size_t errlen)
{
    char port[16];
    const cJSON *ev;
    env_set(e, "PATH", getenv("PATH") ? getenv("PATH") : "/usr/local/bin:/usr/bin:/bin");
    env_set(e, "HOME", getenv("HOME") ? getenv("HOME") : "/");
    env_set(e, "HOSTNAME", kp->name);
    snprintf(port, sizeof port, "%d", srv->port);
    env_set(e, "KUBERNETES_SERVICE_HOST", "127.0.0.1");
    env_set(e, "KUBERNETES_SERVICE_PORT", port);
    if (env_from(srv, kp, spec, e, err, errlen))
        return -1;
    cJSON_ArrayForEach(ev, cJSON_GetObjectItem(spec, "env"))
    {
        const char *name = si_str(ev, "name");
        const cJSON *vf = cJSON_GetObjectItem(ev, "valueFrom");
        char *val = vf ? value_from(srv, kp, vf, err, errlen)
                       : expand(si_str(ev, "value") ? si_str(ev, "value") : "", e);
        if (!val)
            return -1;
        val = rewrite(val, m);
        if (name)
            env_set(e, name, val);
        free(val);
    }
    return 0;
}

static char **build_argv(const cJSON *spec, const envlist *e, const mounts *m)
{
    const cJSON *cmd = cJSON_GetObjectItem(spec, "command"), *args = cJSON_GetObjectItem(spec, "args"), *x;
    char **argv = calloc((size_t)(cJSON_GetArraySize(cmd) + cJSON_GetArraySize(args) + 1), sizeof *argv);
    int n = 0;
    cJSON_ArrayForEach(x, cmd) if (cJSON_IsString(x)) argv[n++] = rewrite(expand(x->valuestring, e), m);
    cJSON_ArrayForEach(x, args) if (cJSON_IsString(x)) argv[n++] = rewrite(expand(x->valuestring, e), m);
    return argv;
}

static void set_waiting(kcont *c, const char *reason, const char *msg)
{
    c->state = KC_WAITING;
    snprintf(c->reason, sizeof c->reason, "%s", reason);
    snprintf(c->message, sizeof c->message, "%s", msg);
}

static void child(const char *log, const char *wd, char **argv, char **envp, int errfd)
{
    setpgid(0, 0);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644), in = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
    }
    if (in >= 0)
        dup2(in, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    if (errfd > 3)
        close_range(3, (unsigned)errfd - 1, 0);
    close_range((unsigned)errfd + 1, ~0U, 0);
    int e = 0;
    if (chdir(wd) == 0)
        execvpe(argv[0], argv, envp);
    e = errno;
    if (write(errfd, &e, sizeof e) < 0)
        _exit(126);
    _exit(127);
}

/* fork/exec; the errno of a failed chdir or exec comes back through a close-on-exec pipe. */
static int spawn(kcont *c, const char *log, const char *wd, char **argv, char **envp)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC))
        return -1;
    pid_t pid = fork();
    if (pid == 0)
        child(log, wd, argv, envp, p[1]);
    close(p[1]);
    int err = 0;
    ssize_t n = pid > 0 ? read(p[0], &err, sizeof err) : -1;
    close(p[0]);
    if (pid < 0 || n > 0) {
        char msg[480];
        if (pid > 0)
            waitpid(pid, NULL, 0);
        snprintf(msg, sizeof msg, "exec: \"%s\": %s", argv[0],
                 err == ENOENT ? "executable file not found in $PATH" : strerror(err ? err : errno));
        c->state = KC_TERMINATED;
        c->exit_code = 128;
        snprintf(c->reason, sizeof c->reason, "StartError");
        snprintf(c->message, sizeof c->message, "%s", msg);
        c->started = c->finished = time(NULL);
        return -1;
    }
    c->pid = pid;
    c->state = KC_RUNNING;
    c->reason[0] = c->message[0] = '\0';
    c->started = time(NULL);
    return 0;
}

int kl_start_container(si_server *srv, kpod *kp, kcont *c)
{
    const cJSON *spec = container_spec(kp, c);
    char err[512] = "", log[PATH_MAX + 80], wd[PATH_MAX];
    mounts *m = calloc(1, sizeof *m);
    envlist e = {0};
    int rc = -1;
    if (!spec || !cJSON_GetArraySize(cJSON_GetObjectItem(spec, "command"))) {
        set_waiting(c, "CreateContainerError",
                    "k8s-standin runs no images: the container needs a command (its image's "
                    "ENTRYPOINT cannot be known)");
        goto out;
    }
    volume_mounts(kp, spec, m);
    pthread_mutex_lock(&srv->store.mu);
    int env_rc = build_env(srv, kp, spec, m, &e, err, sizeof err);
    pthread_mutex_unlock(&srv->store.mu);
    if (env_rc) {
        set_waiting(c, "CreateContainerConfigError", err);
        goto out;
    }
    char **argv = build_argv(spec, &e, m);
    char *dir = si_str(spec, "workingDir") ? rewrite(strdup(si_str(spec, "workingDir")), m) : strdup(kp->dir);
    snprintf(wd, sizeof wd, "%s", dir);
    free(dir);
    snprintf(log, sizeof log, "%s/%s.log", kp->dir, c->name);
    rc = spawn(c, log, wd, argv, e.kv);
    for (char **a = argv; *a; a++)
        free(*a);
    free(argv);
out:
    env_free(&e);
    free(m);
    return rc;
}
