/* serviceaccount.c: what a real cluster does for service accounts, as far as pods see it: the
 * ServiceAccount admission plugin on a pod create (plugin/pkg/admission/serviceaccount: the
 * `default` account when none is named, 403 when the account does not exist, its
 * imagePullSecrets, and unless automountServiceAccountToken says no, a projected
 * kube-api-access-<5 random> volume mounted read-only at /var/run/secrets/kubernetes.io/
 * serviceaccount in every container and init container that does not mount that path
 * itself), and what kube-controller-manager makes in every new namespace: the `default`
 * ServiceAccount and the kube-root-ca.crt ConfigMap (a placeholder CA: there is no TLS here).
 * The store mutex is held by the caller. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

#define TOKEN_PATH "/var/run/secrets/kubernetes.io/serviceaccount"
#define VOLUME_PREFIX "kube-api-access-"

/* base64 of "k8s-standin is not a certificate authority": PEM-shaped, no certificate. */
static const char ROOT_CA[] = "-----BEGIN CERTIFICATE-----\n"
                              "azhzLXN0YW5kaW4gaXMgbm90IGEgY2VydGlmaWNhdGUgYXV0aG9yaXR5\n"
                              "-----END CERTIFICATE-----\n";

/* The volume TokenVolumeSource() describes (expirationSeconds 3607, defaultMode 420). */
static cJSON *token_volume(const char *name)
{
    cJSON *v = cJSON_Parse(
        "{\"projected\":{\"sources\":[{\"serviceAccountToken\":{\"expirationSeconds\":3607,"
        "\"path\":\"token\"}},{\"configMap\":{\"name\":\"kube-root-ca.crt\",\"items\":[{\"key\":"
        "\"ca.crt\",\"path\":\"ca.crt\"}]}},{\"downwardAPI\":{\"items\":[{\"path\":\"namespace\","
        "\"fieldRef\":{\"apiVersion\":\"v1\",\"fieldPath\":\"metadata.namespace\"}}]}}],"
        "\"defaultMode\":420}}");
    cJSON_AddItemToObject(v, "name", cJSON_CreateString(name));
    return v;
}

static bool mounts_token_path(const cJSON *container)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(container, "volumeMounts"))
    {
        const char *p = si_str(m, "mountPath");
        if (p && !strcmp(p, TOKEN_PATH))
            return true;
    }
    return false;
}

static cJSON *array_in(cJSON *obj, const char *key)
{
    cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsArray(a))
        return a;
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    return cJSON_AddArrayToObject(obj, key);
}

/* mountServiceAccountToken: a kube-api-access-* volume of the pod's own is the one mounted. */
static void mount_token(cJSON *spec)
{
    char name[64] = "", suffix[6];
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(spec, "volumes"))
    {
        const char *n = si_str(v, "name");
        if (n && !strncmp(n, VOLUME_PREFIX, strlen(VOLUME_PREFIX)) && !name[0])
            snprintf(name, sizeof name, "%s", n);
    }
    bool have = name[0] != '\0', needed = false;
    if (!have) {
        si_random_suffix(suffix);
        snprintf(name, sizeof name, VOLUME_PREFIX "%s", suffix);
    }
    static const char *const lists[] = {"initContainers", "containers"};
    for (int i = 0; i < 2; i++) {
        cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(spec, lists[i]))
        {
            if (!cJSON_IsObject(c) || mounts_token_path(c))
                continue;
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "name", name);
            cJSON_AddBoolToObject(m, "readOnly", true);
            cJSON_AddStringToObject(m, "mountPath", TOKEN_PATH);
            cJSON_AddItemToArray(array_in(c, "volumeMounts"), m);
            needed = true;
        }
    }
    if (!have && needed)
        cJSON_AddItemToArray(array_in(spec, "volumes"), token_volume(name));
}

/* shouldAutomount: the pod's preference wins, then the account's, else true. */
static bool automount(const cJSON *spec, const cJSON *sa)
{
    const cJSON *p = cJSON_GetObjectItem(spec, "automountServiceAccountToken");
    const cJSON *a = cJSON_GetObjectItem(sa, "automountServiceAccountToken");
    return cJSON_IsBool(p) ? cJSON_IsTrue(p) : cJSON_IsBool(a) ? cJSON_IsTrue(a) : true;
}

int si_sa_admit(si_server *srv, cJSON *pod, si_result *res)
{
    cJSON *spec = si_obj_child(pod, "spec");
    const char *ns = si_str(pod, "metadata.namespace"), *name = si_str(spec, "serviceAccountName");
    if (!name || !*name) {
        si_set_str(spec, "serviceAccountName", "default");
        name = "default";
    }
    si_resource *r = si_builtin(&srv->store, "", "serviceaccounts");
    si_obj *sa = si_store_get(&srv->store, r, ns ? ns : "", name);
    if (!sa) {
        *res = si_fail(403, "Forbidden", si_builtin(&srv->store, "", "pods"),
                       si_str(pod, "metadata.name"),
                       "pods \"%s\" is forbidden: error looking up service account %s/%s: "
                       "serviceaccount \"%s\" not found",
                       si_str(pod, "metadata.name"), ns ? ns : "", name, name);
        return -1;
    }
    if (automount(spec, sa->json))
        mount_token(spec);
    const cJSON *pulls = cJSON_GetObjectItem(sa->json, "imagePullSecrets");
    if (cJSON_GetArraySize(pulls) && !cJSON_GetArraySize(cJSON_GetObjectItem(spec, "imagePullSecrets"))) {
        cJSON_DeleteItemFromObjectCaseSensitive(spec, "imagePullSecrets");
        cJSON_AddItemToObject(spec, "imagePullSecrets", cJSON_Duplicate(pulls, true));
    }
    return 0;
}

static void create_in(si_server *srv, const char *plural, const char *ns, cJSON *body)
{
    si_result res = si_create(srv, si_builtin(&srv->store, "", plural), ns, body, NULL);
    si_result_free(&res);
}

void si_namespace_created(si_server *srv, const char *ns)
{
    cJSON *sa = cJSON_CreateObject();
    si_set_str(si_obj_child(sa, "metadata"), "name", "default");
    create_in(srv, "serviceaccounts", ns, sa);
    cJSON *cm = cJSON_CreateObject(), *meta = si_obj_child(cm, "metadata");
    si_set_str(meta, "name", "kube-root-ca.crt");
    si_set_str(si_obj_child(meta, "annotations"), "kubernetes.io/description",
               "Contains a CA bundle that can be used to verify the kube-apiserver when using "
               "internal endpoints such as the internal service IP or kubernetes.default.svc. No "
               "other usage is guaranteed across distributions of Kubernetes clusters.");
    si_set_str(si_obj_child(cm, "data"), "ca.crt", ROOT_CA);
    create_in(srv, "configmaps", ns, cm);
}
