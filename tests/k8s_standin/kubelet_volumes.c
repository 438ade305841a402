/* kubelet_volumes.c: the stand-in kubelet's volumes, directories under
 * <pod dir>/volumes/<name> written once when the pod starts: emptyDir; secret and configMap
 * (one file per key, or per item); downwardAPI (fieldRef items); projected (sources
 * serviceAccountToken, configMap, secret and downwardAPI in one directory, as the
 * kube-api-access-* volume of ServiceAccount admission needs); hostPath is used in place. A
 * missing secret or configMap that is not optional fails the pod's start (it is retried). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kubelet.h"

static int mkdirs(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, mode) && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(buf, mode) && errno != EEXIST ? -1 : 0;
}

static int write_file(const char *dir, const char *rel, const void *data, size_t len, int mode)
{
    char path[PATH_MAX];
    if (strstr(rel, "..") || rel[0] == '/' ||
        snprintf(path, sizeof path, "%s/%s", dir, rel) >= (int)sizeof path)
        return -1;
    char *slash = strrchr(path, '/');
    *slash = '\0';
    mkdirs(path, 0755);
    *slash = '/';
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int rc = write(fd, data, len) == (ssize_t)len ? 0 : -1;
    fchmod(fd, (mode_t)mode);
    close(fd);
    return rc;
}

/* A volume's (or a projected volume's) defaultMode, else 0644. */
static int default_mode(const cJSON *vol)
{
    const cJSON *dm = cJSON_GetObjectItem(vol, "defaultMode");
    return cJSON_IsNumber(dm) ? dm->valueint : 0644;
}

/* The item of items that names key (NULL: none); without items every key is written. */
static const cJSON *item_for(const cJSON *items, const char *key)
{
    const cJSON *it, *hit = NULL;
    cJSON_ArrayForEach(it, items) if (si_str(it, "key") && !strcmp(si_str(it, "key"), key)) hit = it;
    return hit;
}

/* Files of a secret or configMap object src: every key, or just the items [{key, path, mode}]. */
static int write_keys(const char *dir, const cJSON *src, bool secret, const cJSON *items, int mode,
                      const char *what, char *err, size_t errlen)
{
    const cJSON *kv;
    static const char *const lists[] = {"data", "binaryData"};
    for (int l = 0; l < 2; l++)
        cJSON_ArrayForEach(kv, cJSON_GetObjectItem(src, lists[l]))
        {
            const char *rel = kv->string;
            int m = mode;
            const cJSON *hit = items ? item_for(items, kv->string) : NULL;
            if (items && !hit)
                continue;
            if (hit && si_str(hit, "path"))
                rel = si_str(hit, "path");
            if (hit && cJSON_IsNumber(cJSON_GetObjectItem(hit, "mode")))
                m = cJSON_GetObjectItem(hit, "mode")->valueint;
            size_t len = 0;
            bool b64 = secret || l == 1;
            unsigned char *raw = b64 && cJSON_IsString(kv) ? si_base64_decode(kv->valuestring, &len) : NULL;
            const void *bytes = b64 ? (const void *)raw : (const void *)kv->valuestring;
            if (!b64 && cJSON_IsString(kv))
                len = strlen(kv->valuestring);
            int rc = bytes ? write_file(dir, rel, bytes, len, m) : -1;
            free(raw);
            if (rc) {
                snprintf(err, errlen, "cannot write %s key %s of volume %s", lists[l], kv->string, what);
                return -1;
            }
        }
    return 0;
}

/* A secret (its name under name_key: secretName, or name in a projection) or a configMap. */
static int source_volume(si_server *srv, const kpod *kp, const cJSON *vol, const char *dir,
                         bool secret, const char *name_key, int mode, char *err, size_t errlen)
{
    const char *name = si_str(vol, name_key);
    si_resource *r = si_builtin(&srv->store, "", secret ? "secrets" : "configmaps");
    pthread_mutex_lock(&srv->store.mu);
    si_obj *o = name ? si_store_get(&srv->store, r, kp->ns, name) : NULL;
    cJSON *copy = o ? cJSON_Duplicate(o->json, true) : NULL;
    pthread_mutex_unlock(&srv->store.mu);
    int rc = 0;
    if (!copy && !cJSON_IsTrue(cJSON_GetObjectItem(vol, "optional"))) {
        snprintf(err, errlen, "MountVolume.SetUp failed: %s \"%s\" not found",
                 secret ? "secret" : "configmap", name ? name : "");
        rc = -1;
    }
    if (!rc && copy)
        rc = write_keys(dir, copy, secret, cJSON_GetObjectItem(vol, "items"), mode,
                        name ? name : "", err, errlen);
    cJSON_Delete(copy);
    return rc;
}

static int downward_volume(const kpod *kp, const cJSON *vol, const char *dir, int mode,
                           char *err, size_t errlen)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(vol, "items"))
    {
        const char *fp = si_str(it, "fieldRef.fieldPath"), *rel = si_str(it, "path");
        const cJSON *v = fp ? si_get(kp->pod, fp) : NULL, *m = cJSON_GetObjectItem(it, "mode");
        char *text = cJSON_IsString(v) ? strdup(v->valuestring) : v ? cJSON_PrintUnformatted(v) : strdup("");
        int rc = rel ? write_file(dir, rel, text, strlen(text), cJSON_IsNumber(m) ? m->valueint : mode) : -1;
        free(text);
        if (rc) {
            snprintf(err, errlen, "cannot write downwardAPI item %s", rel ? rel : "(no path)");
            return -1;
        }
    }
    return 0;
}

/* A serviceAccountToken projection: the stand-in's --token when it has one (so a pod's
 * in-cluster client gets in), else a placeholder that names the account (any token is good). */
static int token_file(si_server *srv, const kpod *kp, const cJSON *src, const char *dir, int mode,
                      char *err, size_t errlen)
{
    const char *rel = si_str(src, "path"), *sa = si_str(kp->pod, "spec.serviceAccountName");
    char token[600];
    if (srv->cfg.token)
        snprintf(token, sizeof token, "%s", srv->cfg.token);
    else
        snprintf(token, sizeof token, "k8s-standin:serviceaccount:%s:%s", kp->ns, sa ? sa : "default");
    if (rel && !write_file(dir, rel, token, strlen(token), mode))
        return 0;
    snprintf(err, errlen, "cannot write serviceAccountToken %s", rel ? rel : "(no path)");
    return -1;
}

static int projected_volume(si_server *srv, const kpod *kp, const cJSON *vol, const char *dir,
                            char *err, size_t errlen)
{
    int mode = default_mode(vol), rc = 0;
    const cJSON *src, *x;
    cJSON_ArrayForEach(src, cJSON_GetObjectItem(vol, "sources"))
    {
        if ((x = cJSON_GetObjectItem(src, "serviceAccountToken")))
            rc = token_file(srv, kp, x, dir, mode, err, errlen);
        else if ((x = cJSON_GetObjectItem(src, "configMap")) || (x = cJSON_GetObjectItem(src, "secret")))
            rc = source_volume(srv, kp, x, dir, !strcmp(x->string, "secret"), "name", mode, err, errlen);
        else if ((x = cJSON_GetObjectItem(src, "downwardAPI")))
            rc = downward_volume(kp, x, dir, mode, err, errlen);
        else {
            snprintf(err, errlen, "k8s-standin supports the serviceAccountToken, configMap, secret "
                                  "and downwardAPI sources of projected volumes only");
            rc = -1;
        }
        if (rc)
            return -1;
    }
    return 0;
}

static int one_volume(si_server *srv, const kpod *kp, const cJSON *vol, const char *dir,
                      char *err, size_t errlen)
{
    const cJSON *x;
    if (mkdirs(dir, 0755)) {
        snprintf(err, errlen, "cannot make the volume directory %s: %s", dir, strerror(errno));
        return -1;
    }
    if (cJSON_GetObjectItem(vol, "emptyDir"))
        return 0;
    if ((x = cJSON_GetObjectItem(vol, "secret")))
        return source_volume(srv, kp, x, dir, true, "secretName", default_mode(x), err, errlen);
    if ((x = cJSON_GetObjectItem(vol, "configMap")))
        return source_volume(srv, kp, x, dir, false, "name", default_mode(x), err, errlen);
    if ((x = cJSON_GetObjectItem(vol, "downwardAPI")))
        return downward_volume(kp, x, dir, default_mode(x), err, errlen);
    if ((x = cJSON_GetObjectItem(vol, "projected")))
        return projected_volume(srv, kp, x, dir, err, errlen);
    snprintf(err, errlen, "volume \"%s\": k8s-standin supports emptyDir, secret, configMap, "
                          "downwardAPI, projected and hostPath volumes only", si_str(vol, "name"));
    return -1;
}

int kl_prepare_volumes(si_server *srv, kpod *kp, char *err, size_t errlen)
{
    char dir[PATH_MAX];
    const cJSON *vol;
    if (mkdirs(kp->dir, 0755)) {
        snprintf(err, errlen, "cannot make the pod directory %s: %s", kp->dir, strerror(errno));
        return -1;
    }
    cJSON_ArrayForEach(vol, si_get(kp->pod, "spec.volumes"))
    {
        const char *name = si_str(vol, "name");
        if (!name || snprintf(dir, sizeof dir, "%s/volumes/%s", kp->dir, name) >= (int)sizeof dir)
            continue;
        if (cJSON_GetObjectItem(vol, "hostPath")) {
            const char *type = si_str(vol, "hostPath.type"), *path = si_str(vol, "hostPath.path");
            if (path && type && !strcmp(type, "DirectoryOrCreate"))
                mkdirs(path, 0755);
            continue;
        }
        if (one_volume(srv, kp, vol, dir, err, errlen))
            return -1;
    }
    return 0;
}
