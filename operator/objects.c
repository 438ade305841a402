/* operator/objects.c: the Kubernetes objects the operator creates for a TrainingJob (worker,
 * parameter-server and teacher pods, the headless Service, the job's Secret, Events), built from the
 * parsed job. Pure: no API calls (it reads the operator's etcd TLS files once, at start), so
 * each object's shape is tested alone.
 *
 * How edl-agent runs inside an image we do not own: an init container from the operator's
 * agent image copies the agent (`edl-agent --install`) into an emptyDir that the first
 * container mounts at /edl/bin; its command becomes
 * /edl/bin/edl-agent --job <ns>.<name> [--role ps | --role teacher --service S ...] --
 * <the template's command and args> (the workers' template, spec.ps's for a parameter server,
 * spec.teachers's for a teacher). An agent image that holds the Python package also installs
 * it in /edl/bin/python, which the first container's PYTHONPATH names. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/evp.h>

#include "edl/k8s.h"
#include "operator.h"

#define AGENT_DIR "/edl/bin"
#define PYTHON_DIR AGENT_DIR "/python" /* the edl Python package, when the agent image has it */
#define SECRET_DIR "/edl/secret"
#define SECRET_KEY "job-secret"
#define TLS_FILE_MAX (64 << 10)

/* The etcd TLS files in the job's Secret: its key, the pods' variable naming the file. */
static const struct {
    const char *key, *env;
    size_t off;
} TLS_FILES[] = {
    {"etcd-ca.crt", "EDL_ETCD_CACERT", offsetof(op_etcd_tls, ca)},
    {"etcd-tls.crt", "EDL_ETCD_CERT", offsetof(op_etcd_tls, cert)},
    {"etcd-tls.key", "EDL_ETCD_KEY", offsetof(op_etcd_tls, key)},
};

static char *tls_file(const op_etcd_tls *tls, size_t i)
{
    return tls ? *(char *const *)((const char *)tls + TLS_FILES[i].off) : NULL;
}

char *op_etcd_job_name(const char *ns, const char *name)
{
    size_t len = strlen(ns) + strlen(name) + 2;
    char *s = malloc(len);
    if (s)
        snprintf(s, len, "%s.%s", ns, name);
    return s;
}

char *op_selector(const char *job)
{
    static const char role[] = "," EDL_TJ_LABEL_ROLE "=" EDL_ROLE_WORKER;
    size_t len = strlen(job) + sizeof EDL_TJ_LABEL_JOB + sizeof role;
    char *s = malloc(len);
    if (s)
        snprintf(s, len, "%s=%s%s", EDL_TJ_LABEL_JOB, job, role);
    return s;
}

char *op_secret_name(const char *job)
{
    size_t len = strlen(job) + sizeof "-edl-secret";
    char *s = malloc(len);
    if (s)
        snprintf(s, len, "%s-edl-secret", job);
    return s;
}

cJSON *op_owner_ref(const edl_trainingjob *tj)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "apiVersion", EDL_TJ_API_VERSION);
    cJSON_AddStringToObject(o, "kind", EDL_TJ_KIND);
    cJSON_AddStringToObject(o, "name", tj->name);
    cJSON_AddStringToObject(o, "uid", tj->uid ? tj->uid : "");
    cJSON_AddBoolToObject(o, "controller", true);
    cJSON_AddBoolToObject(o, "blockOwnerDeletion", true);
    return o;
}

cJSON *op_owned_metadata(const edl_trainingjob *tj, const char *name, const cJSON *extra)
{
    cJSON *md = cJSON_CreateObject();
    cJSON_AddStringToObject(md, "name", name);
    cJSON_AddStringToObject(md, "namespace", tj->ns);
    cJSON *labels = extra ? cJSON_Duplicate(extra, true) : cJSON_CreateObject();
    cJSON_DeleteItemFromObjectCaseSensitive(labels, EDL_TJ_LABEL_JOB);
    cJSON_AddStringToObject(labels, EDL_TJ_LABEL_JOB, tj->name);
    cJSON_AddItemToObject(md, "labels", labels);
    cJSON *refs = cJSON_AddArrayToObject(md, "ownerReferences");
    cJSON_AddItemToArray(refs, op_owner_ref(tj));
    return md;
}

static cJSON *env_value(const char *name, const char *value)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "value", value);
    return e;
}

static cJSON *env_field(const char *name, const char *field_path)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    cJSON *ref = cJSON_AddObjectToObject(cJSON_AddObjectToObject(e, "valueFrom"), "fieldRef");
    cJSON_AddStringToObject(ref, "fieldPath", field_path);
    return e;
}

static void add_mount(cJSON *container, const char *name, const char *path, bool ro)
{
    cJSON *mounts = cJSON_GetObjectItemCaseSensitive(container, "volumeMounts");
    if (!cJSON_IsArray(mounts)) {
        cJSON_DeleteItemFromObjectCaseSensitive(container, "volumeMounts");
        mounts = cJSON_AddArrayToObject(container, "volumeMounts");
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddStringToObject(m, "mountPath", path);
    cJSON_AddBoolToObject(m, "readOnly", ro);
    cJSON_AddItemToArray(mounts, m);
}

static cJSON *array_of(cJSON *obj, const char *key)
{
    cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsArray(a)) {
        cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
        a = cJSON_AddArrayToObject(obj, key);
    }
    return a;
}

static void add_secret_volume(cJSON *volumes, const char *name, const char *secret)
{
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "name", name);
    cJSON *sv = cJSON_AddObjectToObject(v, "secret");
    cJSON_AddStringToObject(sv, "secretName", secret);
    cJSON_AddNumberToObject(sv, "defaultMode", 0400); /* the job secret must be private */
    cJSON_AddItemToArray(volumes, v);
}

/* A teacher's port: its first container's first containerPort (0: none, the agent picks). */
static int container_port(const cJSON *c)
{
    const cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(c, "ports"), 0);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(p, "containerPort");
    return cJSON_IsNumber(n) && n->valuedouble >= 1 && n->valuedouble <= 65535 ?
           (int)n->valuedouble : 0;
}

static void add_arg(cJSON *cmd, const char *a)
{
    cJSON_AddItemToArray(cmd, cJSON_CreateString(a));
}

/* The trainer imports the edl package that the init container installed (PYTHON_DIR): after
 * the template's own PYTHONPATH value when its env sets one (one set from a ConfigMap stays as
 * it is; an image's ENV PYTHONPATH is replaced: docs/kubernetes.md says so). */
static void add_python_path(cJSON *env)
{
    cJSON *e;
    cJSON_ArrayForEach(e, env) {
        const char *name = edl_k8s_str(e, "name"), *value = edl_k8s_str(e, "value");
        if (!name || strcmp(name, "PYTHONPATH") != 0)
            continue;
        if (cJSON_GetObjectItemCaseSensitive(e, "valueFrom"))
            return;
        size_t len = (value ? strlen(value) : 0) + sizeof ":" PYTHON_DIR;
        char *joined = malloc(len);
        if (!joined)
            return;
        snprintf(joined, len, "%s%s" PYTHON_DIR, value ? value : "", value && *value ? ":" : "");
        cJSON_DeleteItemFromObjectCaseSensitive(e, "value");
        cJSON_AddStringToObject(e, "value", joined);
        free(joined);
        return;
    }
    cJSON_AddItemToArray(env, env_value("PYTHONPATH", PYTHON_DIR));
}

/* The first container: edl-agent (of the role) in front of the template's command, edl's
 * environment. */
static void wrap_container(cJSON *c, const edl_trainingjob *tj, op_role role,
                           const op_pod_settings *s)
{
    char *const *command = role == OP_PS ? tj->ps_command :
                           role == OP_TEACHER ? tj->teacher_command : tj->command;
    size_t n_command = role == OP_PS ? tj->n_ps_command :
                       role == OP_TEACHER ? tj->n_teacher_command : tj->n_command;
    int port = role == OP_TEACHER ? container_port(c) : 0;
    cJSON *cmd = cJSON_CreateArray();
    cJSON_AddItemToArray(cmd, cJSON_CreateString(AGENT_DIR "/edl-agent"));
    cJSON_AddItemToArray(cmd, cJSON_CreateString("--job"));
    cJSON_AddItemToArray(cmd, cJSON_CreateString(s->etcd_job));
    if (s->prefix) {
        cJSON_AddItemToArray(cmd, cJSON_CreateString("--prefix"));
        cJSON_AddItemToArray(cmd, cJSON_CreateString(s->prefix));
    }
    if (role != OP_WORKER) {
        add_arg(cmd, "--role");
        add_arg(cmd, op_role_name(role));
    }
    if (role == OP_TEACHER) {
        char num[16];
        add_arg(cmd, "--service");
        add_arg(cmd, tj->spec.teachers_service);
        if (tj->teacher_model) {
            add_arg(cmd, "--model");
            add_arg(cmd, tj->teacher_model);
        }
        if (tj->teacher_capacity > 0) {
            snprintf(num, sizeof num, "%d", tj->teacher_capacity);
            add_arg(cmd, "--capacity");
            add_arg(cmd, num);
        }
        if (port) {
            snprintf(num, sizeof num, "%d", port);
            add_arg(cmd, "--port");
            add_arg(cmd, num);
        }
    }
    char mport[16];
    snprintf(mport, sizeof mport, "%d", s->agent_metrics_port);
    if (s->agent_metrics_port > 0) {
        add_arg(cmd, "--metrics-port");
        add_arg(cmd, mport);
    }
    cJSON_AddItemToArray(cmd, cJSON_CreateString("--"));
    for (size_t i = 0; i < n_command; i++)
        cJSON_AddItemToArray(cmd, cJSON_CreateString(command[i]));
    cJSON_DeleteItemFromObjectCaseSensitive(c, "command");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "args");
    cJSON_AddItemToObject(c, "command", cmd);
    cJSON *env = array_of(c, "env");
    cJSON_AddItemToArray(env, env_field("EDL_POD_ID", "metadata.name"));
    cJSON_AddItemToArray(env, env_field("POD_NAME", "metadata.name"));
    cJSON_AddItemToArray(env, env_field("POD_IP", "status.podIP"));
    cJSON_AddItemToArray(env, env_value("EDL_ETCD_ENDPOINTS", s->etcd_endpoints));
    cJSON_AddItemToArray(env, env_value("EDL_JOB_SECRET_FILE", SECRET_DIR "/" SECRET_KEY));
    add_python_path(env);
    for (size_t i = 0; i < sizeof TLS_FILES / sizeof TLS_FILES[0]; i++)
        if (tls_file(s->etcd_tls, i)) {
            char path[64];
            snprintf(path, sizeof path, SECRET_DIR "/%s", TLS_FILES[i].key);
            cJSON_AddItemToArray(env, env_value(TLS_FILES[i].env, path));
        }
    add_mount(c, "edl-bin", AGENT_DIR, true);
    add_mount(c, "edl-secret", SECRET_DIR, true);
    if (s->agent_metrics_port > 0) { /* after the template's: a teacher's port stays first */
        cJSON *mp = cJSON_CreateObject();
        cJSON_AddStringToObject(mp, "name", "edl-metrics");
        cJSON_AddNumberToObject(mp, "containerPort", s->agent_metrics_port);
        cJSON_AddItemToArray(array_of(c, "ports"), mp);
    }
}

static cJSON *install_container(const char *image)
{
    cJSON *ic = cJSON_CreateObject();
    cJSON_AddStringToObject(ic, "name", "edl-agent-install");
    cJSON_AddStringToObject(ic, "image", image);
    cJSON *cmd = cJSON_AddArrayToObject(ic, "command");
    cJSON_AddItemToArray(cmd, cJSON_CreateString("edl-agent"));
    cJSON_AddItemToArray(cmd, cJSON_CreateString("--install"));
    cJSON_AddItemToArray(cmd, cJSON_CreateString(AGENT_DIR));
    add_mount(ic, "edl-bin", AGENT_DIR, false);
    return ic;
}

const char *op_role_name(op_role role)
{
    return role == OP_PS ? EDL_ROLE_PS : role == OP_TEACHER ? EDL_ROLE_TEACHER : EDL_ROLE_WORKER;
}

op_role op_role_of(const char *label)
{
    if (label && strcmp(label, EDL_ROLE_PS) == 0)
        return OP_PS;
    if (label && strcmp(label, EDL_ROLE_TEACHER) == 0)
        return OP_TEACHER;
    return OP_WORKER;
}

void op_pod_name(const char *job, op_role role, int64_t index, char *buf, size_t len)
{
    snprintf(buf, len, "%s-%s-%lld", job, op_role_name(role), (long long)index);
}

static const cJSON *role_template(const edl_trainingjob *tj, op_role role)
{
    return role == OP_PS ? tj->ps_template :
           role == OP_TEACHER ? tj->teacher_template : tj->pod_template;
}

/* The first container of a template, which edl-agent wraps (wrap_container). */
static cJSON *agent_container(cJSON *spec)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(spec, "containers"), 0);
}

const char *op_agent_container(const edl_trainingjob *tj, op_role role)
{
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(role_template(tj, role), "spec");
    return edl_k8s_str(agent_container((cJSON *)spec), "name");
}

cJSON *op_pod_new(const edl_trainingjob *tj, const op_pod_settings *s, op_role role,
                  int64_t index)
{
    char name[300], idx[32];
    op_pod_name(tj->name, role, index, name, sizeof name);
    snprintf(idx, sizeof idx, "%lld", (long long)index);
    const cJSON *tmpl = role_template(tj, role);
    const cJSON *tmd = cJSON_GetObjectItemCaseSensitive(tmpl, "metadata");
    cJSON *pod = cJSON_CreateObject();
    cJSON_AddStringToObject(pod, "apiVersion", "v1");
    cJSON_AddStringToObject(pod, "kind", "Pod");
    cJSON *md = op_owned_metadata(tj, name, cJSON_GetObjectItemCaseSensitive(tmd, "labels"));
    cJSON *labels = cJSON_GetObjectItemCaseSensitive(md, "labels");
    cJSON_DeleteItemFromObjectCaseSensitive(labels, EDL_TJ_LABEL_ROLE);
    cJSON_DeleteItemFromObjectCaseSensitive(labels, EDL_TJ_LABEL_INDEX);
    cJSON_AddStringToObject(labels, EDL_TJ_LABEL_ROLE, op_role_name(role));
    cJSON_AddStringToObject(labels, EDL_TJ_LABEL_INDEX, idx);
    const cJSON *ann = cJSON_GetObjectItemCaseSensitive(tmd, "annotations");
    if (cJSON_IsObject(ann))
        cJSON_AddItemToObject(md, "annotations", cJSON_Duplicate(ann, true));
    cJSON_AddItemToObject(pod, "metadata", md);
    cJSON *spec = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(tmpl, "spec"), true);
    if (!spec)
        spec = cJSON_CreateObject();
    cJSON_AddItemToObject(pod, "spec", spec);
    /* the operator replaces pods itself, within the job's budget: the kubelet must not */
    cJSON_DeleteItemFromObjectCaseSensitive(spec, "restartPolicy");
    cJSON_AddStringToObject(spec, "restartPolicy", "Never");
    cJSON_DeleteItemFromObjectCaseSensitive(spec, "hostname");
    cJSON_DeleteItemFromObjectCaseSensitive(spec, "subdomain");
    cJSON_AddStringToObject(spec, "hostname", name);
    cJSON_AddStringToObject(spec, "subdomain", tj->name);
    cJSON *inits = array_of(spec, "initContainers");
    cJSON_InsertItemInArray(inits, 0, install_container(s->agent_image));
    wrap_container(agent_container(spec), tj, role, s);
    cJSON *volumes = array_of(spec, "volumes");
    cJSON *bin = cJSON_CreateObject();
    cJSON_AddStringToObject(bin, "name", "edl-bin");
    cJSON_AddObjectToObject(bin, "emptyDir");
    cJSON_AddItemToArray(volumes, bin);
    char *secret = op_secret_name(tj->name);
    add_secret_volume(volumes, "edl-secret", secret ? secret : "");
    free(secret);
    op_pod_schedule(pod, tj); /* spec.schedulingPolicy: the gang's marks, the priority */
    return pod;
}

cJSON *op_service_new(const edl_trainingjob *tj)
{
    cJSON *svc = cJSON_CreateObject();
    cJSON_AddStringToObject(svc, "apiVersion", "v1");
    cJSON_AddStringToObject(svc, "kind", "Service");
    cJSON_AddItemToObject(svc, "metadata", op_owned_metadata(tj, tj->name, NULL));
    cJSON *spec = cJSON_AddObjectToObject(svc, "spec");
    cJSON_AddStringToObject(spec, "clusterIP", "None");
    cJSON_AddBoolToObject(spec, "publishNotReadyAddresses", true);
    cJSON *sel = cJSON_AddObjectToObject(spec, "selector");
    cJSON_AddStringToObject(sel, EDL_TJ_LABEL_JOB, tj->name);
    return svc;
}

cJSON *op_secret_new(const edl_trainingjob *tj, const op_etcd_tls *tls)
{
    unsigned char key[32];
    if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key)
        return NULL;
    char b64[64];
    EVP_EncodeBlock((unsigned char *)b64, key, sizeof key);
    char *name = op_secret_name(tj->name);
    if (!name)
        return NULL;
    cJSON *sec = cJSON_CreateObject();
    cJSON_AddStringToObject(sec, "apiVersion", "v1");
    cJSON_AddStringToObject(sec, "kind", "Secret");
    cJSON_AddItemToObject(sec, "metadata", op_owned_metadata(tj, name, NULL));
    cJSON_AddStringToObject(sec, "type", "Opaque");
    cJSON *data = cJSON_AddObjectToObject(sec, "data");
    cJSON_AddStringToObject(data, SECRET_KEY, b64);
    for (size_t i = 0; i < sizeof TLS_FILES / sizeof TLS_FILES[0]; i++)
        if (tls_file(tls, i))
            cJSON_AddStringToObject(data, TLS_FILES[i].key, tls_file(tls, i));
    free(name);
    return sec;
}

static int load_base64(char **out, const char *path, char *err, size_t errlen)
{
    if (!path)
        return 0;
    char *buf;
    size_t n;
    int rc = edl_file_read(path, TLS_FILE_MAX, &buf, &n, err, errlen);
    if (rc != 0 && rc != EDL_ENOMEM)
        rc = EDL_EINVAL; /* a bad setting of the operator, whatever the file's fault */
    if (rc == 0 && n == 0)
        rc = edl_errf(err, errlen, EDL_EINVAL, "%s: empty", path);
    if (rc == 0 && (*out = malloc(4 * ((n + 2) / 3) + 1)))
        EVP_EncodeBlock((unsigned char *)*out, (unsigned char *)buf, (int)n);
    else if (rc == 0)
        rc = edl_errf(err, errlen, EDL_ENOMEM, "out of memory");
    free(buf);
    return rc;
}

int op_etcd_tls_load(op_etcd_tls *tls, const edl_etcd_config *etcd, char *err, size_t errlen)
{
    *tls = (op_etcd_tls){0};
    int rc = load_base64(&tls->ca, etcd->ca_file, err, errlen);
    if (!rc)
        rc = load_base64(&tls->cert, etcd->cert_file, err, errlen);
    if (!rc)
        rc = load_base64(&tls->key, etcd->key_file, err, errlen);
    if (rc)
        op_etcd_tls_clear(tls);
    return rc;
}

void op_etcd_tls_clear(op_etcd_tls *tls)
{
    if (tls->key)
        explicit_bzero(tls->key, strlen(tls->key));
    free(tls->ca);
    free(tls->cert);
    free(tls->key);
    *tls = (op_etcd_tls){0};
}

cJSON *op_event_new(const cJSON *tj_obj, const char *type, const char *reason,
                    const char *message, const char *reporter)
{
    const char *name = edl_k8s_str(tj_obj, "metadata.name");
    const char *ns = edl_k8s_str(tj_obj, "metadata.namespace");
    const char *uid = edl_k8s_str(tj_obj, "metadata.uid");
    char gen[300], now[40];
    snprintf(gen, sizeof gen, "%s.", name ? name : "trainingjob");
    edl_k8s_time(edl_wall_ms(), false, now, sizeof now);
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "apiVersion", "v1");
    cJSON_AddStringToObject(ev, "kind", "Event");
    cJSON *md = cJSON_AddObjectToObject(ev, "metadata");
    cJSON_AddStringToObject(md, "generateName", gen);
    cJSON_AddStringToObject(md, "namespace", ns ? ns : "default");
    cJSON *io = cJSON_AddObjectToObject(ev, "involvedObject");
    cJSON_AddStringToObject(io, "apiVersion", EDL_TJ_API_VERSION);
    cJSON_AddStringToObject(io, "kind", EDL_TJ_KIND);
    cJSON_AddStringToObject(io, "name", name ? name : "");
    cJSON_AddStringToObject(io, "namespace", ns ? ns : "default");
    if (uid)
        cJSON_AddStringToObject(io, "uid", uid);
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddStringToObject(ev, "reason", reason);
    cJSON_AddStringToObject(ev, "message", message);
    cJSON_AddStringToObject(ev, "firstTimestamp", now);
    cJSON_AddStringToObject(ev, "lastTimestamp", now);
    cJSON_AddNumberToObject(ev, "count", 1);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(ev, "source"), "component", "edl-operator");
    cJSON_AddStringToObject(ev, "reportingComponent", "edl.dev/operator");
    cJSON_AddStringToObject(ev, "reportingInstance", reporter);
    return ev;
}
