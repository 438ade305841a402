/* config.c: where the API server is and who we are. In a pod: the service account's files and
 * $KUBERNETES_SERVICE_HOST/PORT. Outside: a kubeconfig file read with libyaml (clusters, users,
 * contexts, current-context), as kubectl reads it, minus credential plugins. Every error names
 * the file and the field, so a person can fix it without reading this code. */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "internal.h"

#define SA_ROOT "/var/run/secrets/kubernetes.io/serviceaccount"
#define KUBECONFIG_MAX (4u << 20)

void edl_k8s_config_clear(edl_k8s_config *c)
{
    if (!c)
        return;
    free(c->server);
    free(c->ca_file);
    free(c->ca_data);
    free(c->cert_file);
    free(c->key_file);
    free(c->cert_data);
    if (c->key_data)
        explicit_bzero(c->key_data, strlen(c->key_data));
    free(c->key_data);
    if (c->token)
        explicit_bzero(c->token, strlen(c->token));
    free(c->token);
    free(c->token_file);
    free(c->namespace);
    memset(c, 0, sizeof *c);
}

/* A whole small file, NUL-terminated, with trailing white space cut (tokens, namespaces). */
int k8s_read_file(const char *path, size_t max, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? EDL_ENOTFOUND : EDL_EIO;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    int err = ferror(f);
    fclose(f);
    if (!buf)
        return EDL_ENOMEM;
    if (err || n > max) {
        free(buf);
        return err ? EDL_EIO : EDL_ETOOBIG;
    }
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    buf[n] = '\0';
    *out = buf;
    return 0;
}

/* ---- in-cluster ------------------------------------------------------------------------ */

static bool all_digits(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

static int in_cluster_files(edl_k8s_config *c, const char *root, char *err, size_t errlen)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/token", root);
    if (stat(path, &st) != 0)
        return edl_errf(err, errlen, EDL_ECONFIG,
                        "in-cluster config: no service-account token at %s (%s): is the token mounted (automountServiceAccountToken)?",
                        path, strerror(errno));
    if (!(c->token_file = strdup(path)))
        return EDL_ENOMEM;
    snprintf(path, sizeof path, "%s/ca.crt", root);
    if (stat(path, &st) == 0 && !(c->ca_file = strdup(path)))
        return EDL_ENOMEM;
    snprintf(path, sizeof path, "%s/namespace", root);
    int rc = k8s_read_file(path, 253, &c->namespace);
    if (rc == EDL_ENOMEM)
        return rc;
    if (rc == 0 && !c->namespace[0]) {
        free(c->namespace);
        c->namespace = NULL;
    }
    return 0;
}

int edl_k8s_config_in_cluster(edl_k8s_config *c, const char *root, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    const char *host = getenv("KUBERNETES_SERVICE_HOST"), *port = getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !*host || !port || !*port)
        return edl_errf(err, errlen, EDL_ENOTFOUND,
                        "not in a Kubernetes cluster: KUBERNETES_SERVICE_HOST/PORT are not set");
    if (!all_digits(port) || strlen(port) > 5 || strpbrk(host, "/[]@ "))
        return edl_errf(err, errlen, EDL_ECONFIG,
                        "in-cluster config: KUBERNETES_SERVICE_HOST=%s, KUBERNETES_SERVICE_PORT=%s: not a host and port",
                        host, port);
    size_t n = strlen(host) + strlen(port) + 16;
    if (!(c->server = malloc(n)))
        return EDL_ENOMEM;
    /* an IPv6 address goes in brackets in a URL */
    snprintf(c->server, n, strchr(host, ':') ? "https://[%s]:%s" : "https://%s:%s", host, port);
    int rc = in_cluster_files(c, root ? root : SA_ROOT, err, errlen);
    if (rc)
        edl_k8s_config_clear(c);
    return rc;
}

/* ---- kubeconfig ------------------------------------------------------------------------ */

/* What reading one kubeconfig needs: the document, the file's name and directory (relative
 * paths in it are relative to it), and the error buffer. */
typedef struct kc {
    yaml_document_t doc;
    const char *path;
    char dir[4096];
    char *err;
    size_t errlen;
} kc;

static int kc_fail(kc *k, int code, const char *field, const char *what)
{
    return edl_errf(k->err, k->errlen, code, "kubeconfig %s: %s: %s", k->path, field, what);
}

static yaml_node_t *node_get(kc *k, yaml_node_t *map, const char *key)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(&k->doc, p->key);
        if (kn && kn->type == YAML_SCALAR_NODE && kn->data.scalar.length == strlen(key) &&
            memcmp(kn->data.scalar.value, key, kn->data.scalar.length) == 0)
            return yaml_document_get_node(&k->doc, p->value);
    }
    return NULL;
}

/* A plain empty scalar or ~/null reads as absent, as in Kubernetes' YAML. */
static bool node_null(const yaml_node_t *n)
{
    if (!n)
        return true;
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

/* The string at map.key (*out NULL when absent). field: its path, for messages. */
static int kc_str(kc *k, yaml_node_t *map, const char *key, const char *field, const char **out)
{
    yaml_node_t *n = node_get(k, map, key);
    *out = NULL;
    if (node_null(n))
        return 0;
    char f[512];
    snprintf(f, sizeof f, "%s%s%s", field ? field : "", field ? "." : "", key);
    if (n->type != YAML_SCALAR_NODE)
        return kc_fail(k, EDL_ECONFIG, f, "not a string");
    if (strlen((const char *)n->data.scalar.value) != n->data.scalar.length)
        return kc_fail(k, EDL_ECONFIG, f, "holds a NUL byte");
    *out = (const char *)n->data.scalar.value;
    return 0;
}

static int kc_dup(const char *s, char **out)
{
    free(*out);
    *out = NULL;
    return s && !(*out = strdup(s)) ? EDL_ENOMEM : 0;
}

/* A file path from the kubeconfig: relative ones are relative to its directory. */
static int kc_path(kc *k, const char *s, char **out)
{
    if (!s || s[0] == '/')
        return kc_dup(s, out);
    size_t n = strlen(k->dir) + strlen(s) + 2;
    free(*out);
    if (!(*out = malloc(n)))
        return EDL_ENOMEM;
    snprintf(*out, n, "%s/%s", k->dir, s);
    return 0;
}

static int kc_b64(kc *k, yaml_node_t *map, const char *key, const char *field, char **out)
{
    const char *s;
    int rc = kc_str(k, map, key, field, &s);
    if (rc || !s)
        return rc;
    char f[512];
    snprintf(f, sizeof f, "%s.%s", field, key);
    free(*out);
    size_t n = 0;
    rc = k8s_b64_decode(s, strlen(s), out, &n);
    if (rc == EDL_EPROTO)
        return kc_fail(k, EDL_ECONFIG, f, "not base64");
    if (rc == 0 && strlen(*out) != n) /* PEM is text: a NUL byte means this is not PEM */
        return kc_fail(k, EDL_ECONFIG, f, "holds a NUL byte (expected base64 of PEM text)");
    return rc;
}

/* The entry of list `section` (clusters, users, contexts) whose name is `name`: its inner
 * mapping (under `inner`), with its field path in field. */
static int kc_find(kc *k, const char *section, const char *inner, const char *name,
                   yaml_node_t **out, char *field, size_t fieldlen)
{
    yaml_node_t *root = yaml_document_get_root_node(&k->doc);
    yaml_node_t *list = node_get(k, root, section);
    *out = NULL;
    if (list && !node_null(list) && list->type != YAML_SEQUENCE_NODE)
        return kc_fail(k, EDL_ECONFIG, section, "not a list");
    int i = 0;
    for (yaml_node_item_t *it = list && list->type == YAML_SEQUENCE_NODE ? list->data.sequence.items.start : NULL;
         it && it < list->data.sequence.items.top; it++, i++) {
        yaml_node_t *e = yaml_document_get_node(&k->doc, *it);
        yaml_node_t *nn = node_get(k, e, "name");
        if (!nn || nn->type != YAML_SCALAR_NODE || strcmp((const char *)nn->data.scalar.value, name))
            continue;
        snprintf(field, fieldlen, "%s[%d].%s", section, i, inner);
        *out = node_get(k, e, inner);
        if (node_null(*out) || (*out)->type != YAML_MAPPING_NODE)
            return kc_fail(k, EDL_ECONFIG, field, node_null(*out) ? "missing" : "not a mapping");
        return 0;
    }
    char what[512];
    snprintf(what, sizeof what, "no entry named \"%s\"", name);
    return kc_fail(k, EDL_ECONFIG, section, what);
}

static int kc_cluster(kc *k, edl_k8s_config *c, const char *name)
{
    char field[128];
    yaml_node_t *m;
    const char *server, *ca, *insecure;
    int rc = kc_find(k, "clusters", "cluster", name, &m, field, sizeof field);
    if (!rc)
        rc = kc_str(k, m, "server", field, &server);
    if (!rc && !server) {
        char f[160];
        snprintf(f, sizeof f, "%s.server", field);
        return kc_fail(k, EDL_ECONFIG, f, "missing");
    }
    if (!rc && strncmp(server, "https://", 8) && strncmp(server, "http://", 7)) {
        char f[160];
        snprintf(f, sizeof f, "%s.server", field);
        return kc_fail(k, EDL_ECONFIG, f, "not an http:// or https:// URL");
    }
    if (!rc)
        rc = kc_dup(server, &c->server);
    if (!rc)
        rc = kc_str(k, m, "certificate-authority", field, &ca);
    if (!rc)
        rc = kc_path(k, ca, &c->ca_file);
    if (!rc)
        rc = kc_b64(k, m, "certificate-authority-data", field, &c->ca_data);
    if (!rc)
        rc = kc_str(k, m, "insecure-skip-tls-verify", field, &insecure);
    if (!rc && insecure) {
        if (strcmp(insecure, "true") && strcmp(insecure, "false")) {
            char f[160];
            snprintf(f, sizeof f, "%s.insecure-skip-tls-verify", field);
            return kc_fail(k, EDL_ECONFIG, f, "not true or false");
        }
        c->insecure_skip_tls_verify = strcmp(insecure, "true") == 0;
    }
    return rc;
}

/* Credential sources we do not implement are refused by name, not ignored: a user would
 * otherwise see 401s and wonder why. */
static int kc_user_refuse(kc *k, yaml_node_t *m, const char *field)
{
    static const char *const unsupported[][2] = {
        {"exec", "credential plugins (exec) are not supported: use a token, tokenFile or a client certificate"},
        {"auth-provider", "auth providers are not supported: use a token, tokenFile or a client certificate"},
        {"username", "basic authentication is not supported: use a token or a client certificate"},
        {"password", "basic authentication is not supported: use a token or a client certificate"},
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        if (!node_null(node_get(k, m, unsupported[i][0]))) {
            char f[160];
            snprintf(f, sizeof f, "%s.%s", field, unsupported[i][0]);
            return kc_fail(k, EDL_ECONFIG, f, unsupported[i][1]);
        }
    }
    return 0;
}

static int kc_user(kc *k, edl_k8s_config *c, const char *name)
{
    char field[128];
    yaml_node_t *m;
    const char *s;
    int rc = kc_find(k, "users", "user", name, &m, field, sizeof field);
    if (!rc)
        rc = kc_user_refuse(k, m, field);
    if (!rc && !(rc = kc_str(k, m, "client-certificate", field, &s)))
        rc = kc_path(k, s, &c->cert_file);
    if (!rc && !(rc = kc_str(k, m, "client-key", field, &s)))
        rc = kc_path(k, s, &c->key_file);
    if (!rc)
        rc = kc_b64(k, m, "client-certificate-data", field, &c->cert_data);
    if (!rc)
        rc = kc_b64(k, m, "client-key-data", field, &c->key_data);
    if (!rc && !(rc = kc_str(k, m, "token", field, &s)))
        rc = kc_dup(s, &c->token);
    if (!rc && !(rc = kc_str(k, m, "tokenFile", field, &s)))
        rc = kc_path(k, s, &c->token_file);
    if (!rc && (!c->cert_file && !c->cert_data) != (!c->key_file && !c->key_data))
        rc = kc_fail(k, EDL_ECONFIG, field,
                     "a client certificate needs its key (client-certificate(-data) with client-key(-data))");
    return rc;
}

static int kc_context(kc *k, edl_k8s_config *c, const char *context)
{
    const char *name = context, *cluster, *user, *ns;
    int rc = 0;
    if (!name) {
        rc = kc_str(k, yaml_document_get_root_node(&k->doc), "current-context", NULL, &name);
        if (!rc && !name)
            return kc_fail(k, EDL_ECONFIG, "current-context", "not set (name a context)");
        if (rc)
            return rc;
    }
    char field[128], f[160];
    yaml_node_t *m;
    if ((rc = kc_find(k, "contexts", "context", name, &m, field, sizeof field)) ||
        (rc = kc_str(k, m, "cluster", field, &cluster)) || (rc = kc_str(k, m, "user", field, &user)) ||
        (rc = kc_str(k, m, "namespace", field, &ns)))
        return rc;
    if (!cluster) {
        snprintf(f, sizeof f, "%s.cluster", field);
        return kc_fail(k, EDL_ECONFIG, f, "missing");
    }
    if ((rc = kc_dup(ns, &c->namespace)) || (rc = kc_cluster(k, c, cluster)))
        return rc;
    return user ? kc_user(k, c, user) : 0; /* no user: anonymous */
}

static int kc_parse(kc *k, const char *text, size_t len)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return EDL_ENOMEM;
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    int ok = yaml_parser_load(&p, &k->doc);
    int rc = 0;
    if (!ok) {
        rc = edl_errf(k->err, k->errlen, EDL_ECONFIG, "kubeconfig %s:%zu:%zu: not valid YAML: %s",
                      k->path, p.problem_mark.line + 1, p.problem_mark.column + 1,
                      p.problem ? p.problem : "syntax error");
        memset(&k->doc, 0, sizeof k->doc);
    } else if (!yaml_document_get_root_node(&k->doc) ||
               yaml_document_get_root_node(&k->doc)->type != YAML_MAPPING_NODE) {
        rc = edl_errf(k->err, k->errlen, EDL_ECONFIG, "kubeconfig %s: not a mapping (empty file?)", k->path);
    }
    yaml_parser_delete(&p);
    return rc;
}

int edl_k8s_config_kubeconfig(edl_k8s_config *c, const char *path, const char *context,
                              char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    if (!path)
        return edl_errf(err, errlen, EDL_EINVAL, "kubeconfig: no path");
    kc k = {.path = path, .err = err, .errlen = errlen};
    char *text = NULL, tmp[sizeof k.dir];
    snprintf(tmp, sizeof tmp, "%s", path);
    snprintf(k.dir, sizeof k.dir, "%s", dirname(tmp));
    int rc = k8s_read_file(path, KUBECONFIG_MAX, &text);
    if (rc)
        return rc == EDL_ENOMEM ? rc
               : edl_errf(err, errlen, rc == EDL_ENOTFOUND ? EDL_ENOTFOUND : rc,
                          "kubeconfig %s: cannot read it: %s", path,
                          rc == EDL_ETOOBIG ? "over 4 MiB" : strerror(errno));
    rc = kc_parse(&k, text, strlen(text));
    free(text);
    if (!rc)
        rc = kc_context(&k, c, context);
    yaml_document_delete(&k.doc);
    if (rc)
        edl_k8s_config_clear(c);
    return rc;
}

/* ---- what kubectl would use ------------------------------------------------------------- */

int edl_k8s_config_load(edl_k8s_config *c, const char *kubeconfig, const char *context,
                        char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    if (kubeconfig)
        return edl_k8s_config_kubeconfig(c, kubeconfig, context, err, errlen);
    const char *env = getenv("KUBECONFIG");
    if (env && *env) {
        /* a list like $PATH: the first entry is used (merging is not supported) */
        char first[4096];
        size_t n = strcspn(env, ":");
        snprintf(first, sizeof first, "%.*s", (int)n, env);
        if (first[0])
            return edl_k8s_config_kubeconfig(c, first, context, err, errlen);
    }
    int rc = edl_k8s_config_in_cluster(c, NULL, err, errlen);
    if (rc != EDL_ENOTFOUND)
        return rc;
    const char *home = getenv("HOME");
    char path[4096];
    snprintf(path, sizeof path, "%s/.kube/config", home && *home ? home : ".");
    rc = edl_k8s_config_kubeconfig(c, path, context, err, errlen);
    if (rc == EDL_ENOTFOUND)
        edl_errf(err, errlen, rc,
                 "no Kubernetes configuration: no --kubeconfig, $KUBECONFIG unset, not in a cluster, and no %s",
                 path);
    return rc;
}
