/* kv.c: key-value calls (put, range, delete) and transactions built from them. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int edl_etcd_prefix_end(edl_buf prefix, char **end, size_t *end_len)
{
    size_t n = prefix.len;
    while (n > 0 && (unsigned char)prefix.data[n - 1] == 0xff)
        n--;
    char *e = malloc(n ? n + 1 : 2);
    if (!e)
        return EDL_ENOMEM;
    if (n == 0) {
        e[0] = e[1] = '\0'; /* "\0": every key from the start key on */
        *end_len = 1;
    } else {
        memcpy(e, prefix.data, n);
        e[n - 1] = (char)((unsigned char)e[n - 1] + 1);
        e[n] = '\0';
        *end_len = n;
    }
    *end = e;
    return 0;
}

/* key plus range_end: the prefix's end, the caller's explicit end, or none. */
static int add_range(cJSON *req, edl_buf key, bool prefix, edl_buf range_end)
{
    if (!json_add_b64(req, "key", key))
        return EDL_ENOMEM;
    if (prefix) {
        char *e;
        size_t n;
        if (edl_etcd_prefix_end(key, &e, &n) != 0)
            return EDL_ENOMEM;
        cJSON *ok = json_add_b64(req, "range_end", edl_bytes(e, n));
        free(e);
        return ok ? 0 : EDL_ENOMEM;
    }
    if (range_end.len && !json_add_b64(req, "range_end", range_end))
        return EDL_ENOMEM;
    return 0;
}

static int add_bool(cJSON *req, const char *name, bool v)
{
    return !v || cJSON_AddTrueToObject(req, name) ? 0 : EDL_ENOMEM;
}

int range_req(cJSON *req, edl_buf key, const edl_range_opts *o)
{
    static const char *orders[] = {"NONE", "ASCEND", "DESCEND"};
    static const char *targets[] = {"KEY", "VERSION", "CREATE", "MOD", "VALUE"};
    edl_range_opts d = {0};
    if (!o)
        o = &d;
    if ((unsigned)o->sort_order > EDL_SORT_DESCEND || (unsigned)o->sort_target > EDL_SORT_VALUE ||
        o->limit < 0 || o->revision < 0)
        return EDL_EINVAL;
    int rc = add_range(req, key, o->prefix, o->range_end);
    if (rc)
        return rc;
    if ((o->limit && !json_add_i64(req, "limit", o->limit)) ||
        (o->revision && !json_add_i64(req, "revision", o->revision)) ||
        (o->sort_order && (!cJSON_AddStringToObject(req, "sort_order", orders[o->sort_order]) ||
                           !cJSON_AddStringToObject(req, "sort_target", targets[o->sort_target]))))
        return EDL_ENOMEM;
    if (add_bool(req, "keys_only", o->keys_only) || add_bool(req, "count_only", o->count_only))
        return EDL_ENOMEM;
    return 0;
}

int put_req(cJSON *req, edl_buf key, edl_buf value, const edl_put_opts *o)
{
    edl_put_opts d = {0};
    if (!o)
        o = &d;
    if (o->lease < 0)
        return EDL_EINVAL;
    if (!json_add_b64(req, "key", key) || (!o->ignore_value && !json_add_b64(req, "value", value)))
        return EDL_ENOMEM;
    if (o->lease && !json_add_i64(req, "lease", o->lease))
        return EDL_ENOMEM;
    if (add_bool(req, "prev_kv", o->prev_kv) || add_bool(req, "ignore_value", o->ignore_value) ||
        add_bool(req, "ignore_lease", o->ignore_lease))
        return EDL_ENOMEM;
    return 0;
}

int delete_req(cJSON *req, edl_buf key, const edl_delete_opts *o)
{
    edl_delete_opts d = {0};
    if (!o)
        o = &d;
    int rc = add_range(req, key, o->prefix, o->range_end);
    if (!rc)
        rc = add_bool(req, "prev_kv", o->prev_kv);
    return rc;
}

static int header_revision(const cJSON *resp, int64_t *rev)
{
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(resp, "header");
    if (h && !cJSON_IsObject(h))
        return EDL_EPROTO;
    return json_i64(h, "revision", rev);
}

int range_parse(const cJSON *resp, edl_range_result *r)
{
    memset(r, 0, sizeof *r);
    int rc = header_revision(resp, &r->revision);
    if (!rc)
        rc = json_i64(resp, "count", &r->count);
    if (!rc)
        rc = json_bool(resp, "more", &r->more);
    if (!rc)
        rc = kv_array_parse(cJSON_GetObjectItemCaseSensitive(resp, "kvs"), &r->kvs, &r->n_kvs);
    if (!rc && (r->count < 0 || (size_t)r->count < r->n_kvs))
        rc = EDL_EPROTO;
    if (rc)
        edl_range_result_clear(r);
    return rc;
}

static int prev_kv_parse(const cJSON *resp, edl_kv **out)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(resp, "prev_kv");
    *out = NULL;
    if (!p || cJSON_IsNull(p))
        return 0;
    edl_kv *kv = malloc(sizeof *kv);
    if (!kv)
        return EDL_ENOMEM;
    int rc = kv_parse(p, kv);
    if (rc) {
        free(kv);
        return rc;
    }
    *out = kv;
    return 0;
}

int put_parse(const cJSON *resp, edl_put_result *r)
{
    memset(r, 0, sizeof *r);
    int rc = header_revision(resp, &r->revision);
    if (!rc)
        rc = prev_kv_parse(resp, &r->prev_kv);
    return rc;
}

int delete_parse(const cJSON *resp, edl_delete_result *r)
{
    memset(r, 0, sizeof *r);
    int rc = header_revision(resp, &r->revision);
    if (!rc)
        rc = json_i64(resp, "deleted", &r->deleted);
    if (!rc)
        rc = kv_array_parse(cJSON_GetObjectItemCaseSensitive(resp, "prev_kvs"), &r->prev_kvs,
                            &r->n_prev_kvs);
    if (rc)
        edl_delete_result_clear(r);
    return rc;
}

void edl_range_result_clear(edl_range_result *r)
{
    if (!r)
        return;
    kv_array_free(r->kvs, r->n_kvs);
    memset(r, 0, sizeof *r);
}

void edl_put_result_clear(edl_put_result *r)
{
    if (!r)
        return;
    edl_kv_free(r->prev_kv);
    memset(r, 0, sizeof *r);
}

void edl_delete_result_clear(edl_delete_result *r)
{
    if (!r)
        return;
    kv_array_free(r->prev_kvs, r->n_prev_kvs);
    memset(r, 0, sizeof *r);
}

/* Send a request that the caller built (built: the builder's result), or report why not. */
static int kv_call(edl_etcd *c, const char *path, edl_buf key, cJSON *req, int built,
                   bool idempotent, cJSON **resp)
{
    if (built) {
        cJSON_Delete(req);
        return etcd_fail(c, built, "%s: invalid request (%s)", path, edl_strerror(built));
    }
    return etcd_call(c, path, req, resp, key, idempotent, 0);
}

static int parse_fail(edl_etcd *c, int rc, const char *path, edl_buf key)
{
    char ks[96];
    return etcd_fail(c, rc, "%s%s key '%s': %s in the reply", edl_etcd_endpoint(c), path,
                     etcd_key_str(key, ks, sizeof ks),
                     rc == EDL_ENOMEM ? "out of memory" : "unexpected types or invalid base64");
}

int edl_etcd_put(edl_etcd *c, edl_buf key, edl_buf value, const edl_put_opts *opts,
                 edl_put_result *res)
{
    cJSON *req = cJSON_CreateObject(), *resp;
    if (!req)
        return EDL_ENOMEM;
    /* re-sending after a lost reply is harmless, unless the caller wants the previous value */
    bool idem = !(opts && opts->prev_kv);
    int rc = kv_call(c, "/v3/kv/put", key, req, put_req(req, key, value, opts), idem, &resp);
    if (rc == EDL_ENOTFOUND && opts && opts->lease)
        rc = EDL_ELEASE; /* "requested lease not found" */
    if (rc)
        return rc;
    edl_put_result tmp;
    rc = put_parse(resp, &tmp);
    cJSON_Delete(resp);
    if (rc)
        return parse_fail(c, rc, "/v3/kv/put", key);
    if (res)
        *res = tmp;
    else
        edl_put_result_clear(&tmp);
    return 0;
}

int edl_etcd_range(edl_etcd *c, edl_buf key, const edl_range_opts *opts, edl_range_result *res)
{
    cJSON *req = cJSON_CreateObject(), *resp;
    memset(res, 0, sizeof *res);
    if (!req)
        return EDL_ENOMEM;
    int rc = kv_call(c, "/v3/kv/range", key, req, range_req(req, key, opts), true, &resp);
    if (rc)
        return rc;
    rc = range_parse(resp, res);
    cJSON_Delete(resp);
    return rc ? parse_fail(c, rc, "/v3/kv/range", key) : 0;
}

int edl_etcd_get(edl_etcd *c, edl_buf key, edl_kv **out, int64_t *rev)
{
    edl_range_result r;
    *out = NULL;
    int rc = edl_etcd_range(c, key, NULL, &r);
    if (rc)
        return rc;
    if (rev)
        *rev = r.revision;
    if (r.n_kvs == 0) {
        char ks[96];
        edl_range_result_clear(&r);
        return etcd_fail(c, EDL_ENOTFOUND, "key '%s' not found", etcd_key_str(key, ks, sizeof ks));
    }
    edl_kv *kv = malloc(sizeof *kv);
    if (!kv) {
        edl_range_result_clear(&r);
        return EDL_ENOMEM;
    }
    *kv = r.kvs[0];
    memset(&r.kvs[0], 0, sizeof r.kvs[0]);
    edl_range_result_clear(&r);
    *out = kv;
    return 0;
}

int edl_etcd_delete(edl_etcd *c, edl_buf key, const edl_delete_opts *opts, edl_delete_result *res)
{
    cJSON *req = cJSON_CreateObject(), *resp;
    if (!req)
        return EDL_ENOMEM;
    bool idem = !(opts && opts->prev_kv);
    int rc = kv_call(c, "/v3/kv/deleterange", key, req, delete_req(req, key, opts), idem, &resp);
    if (rc)
        return rc;
    edl_delete_result tmp;
    rc = delete_parse(resp, &tmp);
    cJSON_Delete(resp);
    if (rc)
        return parse_fail(c, rc, "/v3/kv/deleterange", key);
    if (res)
        *res = tmp;
    else
        edl_delete_result_clear(&tmp);
    return 0;
}

/* ---- transactions ------------------------------------------------------------------------ */

struct edl_txn {
    cJSON *body; /* {"compare":[],"success":[],"failure":[]} */
    int error;   /* first builder error, reported by edl_etcd_txn */
};

edl_txn *edl_txn_new(void)
{
    edl_txn *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->body = cJSON_CreateObject();
    if (!t->body || !cJSON_AddArrayToObject(t->body, "compare") ||
        !cJSON_AddArrayToObject(t->body, "success") || !cJSON_AddArrayToObject(t->body, "failure")) {
        edl_txn_free(t);
        return NULL;
    }
    return t;
}

void edl_txn_free(edl_txn *t)
{
    if (!t)
        return;
    cJSON_Delete(t->body);
    free(t);
}

static void txn_cmp(edl_txn *t, edl_buf key, edl_cmp_op op, const char *target,
                    const char *field, int64_t num, const edl_buf *value)
{
    static const char *results[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
    if (!t || t->error)
        return;
    if ((unsigned)op > EDL_CMP_NOT_EQUAL) {
        t->error = EDL_EINVAL;
        return;
    }
    cJSON *c = cJSON_CreateObject();
    bool ok = c && json_add_b64(c, "key", key) && cJSON_AddStringToObject(c, "target", target) &&
              cJSON_AddStringToObject(c, "result", results[op]) &&
              (value ? json_add_b64(c, field, *value) != NULL : json_add_i64(c, field, num) != NULL) &&
              cJSON_AddItemToArray(cJSON_GetObjectItem(t->body, "compare"), c);
    if (!ok) {
        cJSON_Delete(c);
        t->error = EDL_ENOMEM;
    }
}

void edl_txn_cmp_value(edl_txn *t, edl_buf key, edl_cmp_op op, edl_buf value)
{
    txn_cmp(t, key, op, "VALUE", "value", 0, &value);
}

void edl_txn_cmp_version(edl_txn *t, edl_buf key, edl_cmp_op op, int64_t version)
{
    txn_cmp(t, key, op, "VERSION", "version", version, NULL);
}

void edl_txn_cmp_create(edl_txn *t, edl_buf key, edl_cmp_op op, int64_t create_revision)
{
    txn_cmp(t, key, op, "CREATE", "create_revision", create_revision, NULL);
}

void edl_txn_cmp_mod(edl_txn *t, edl_buf key, edl_cmp_op op, int64_t mod_revision)
{
    txn_cmp(t, key, op, "MOD", "mod_revision", mod_revision, NULL);
}

void edl_txn_cmp_lease(edl_txn *t, edl_buf key, edl_cmp_op op, int64_t lease)
{
    txn_cmp(t, key, op, "LEASE", "lease", lease, NULL);
}

/* Append {"<kind>": req} to a branch; req is consumed. */
static void txn_op(edl_txn *t, edl_txn_branch b, const char *kind, cJSON *req, int built)
{
    cJSON *op = NULL;
    if (!t || t->error || built || !req || (unsigned)b > EDL_TXN_FAILURE) {
        if (t && !t->error)
            t->error = built ? built : (req ? EDL_EINVAL : EDL_ENOMEM);
        cJSON_Delete(req);
        return;
    }
    op = cJSON_CreateObject();
    if (!op || !cJSON_AddItemToObject(op, kind, req)) {
        cJSON_Delete(op);
        cJSON_Delete(req);
        t->error = EDL_ENOMEM;
        return;
    }
    cJSON *arr = cJSON_GetObjectItem(t->body, b == EDL_TXN_SUCCESS ? "success" : "failure");
    if (!cJSON_AddItemToArray(arr, op)) {
        cJSON_Delete(op);
        t->error = EDL_ENOMEM;
    }
}

void edl_txn_put(edl_txn *t, edl_txn_branch b, edl_buf key, edl_buf value, const edl_put_opts *o)
{
    cJSON *req = cJSON_CreateObject();
    txn_op(t, b, "request_put", req, req ? put_req(req, key, value, o) : 0);
}

void edl_txn_range(edl_txn *t, edl_txn_branch b, edl_buf key, const edl_range_opts *o)
{
    cJSON *req = cJSON_CreateObject();
    txn_op(t, b, "request_range", req, req ? range_req(req, key, o) : 0);
}

void edl_txn_delete(edl_txn *t, edl_txn_branch b, edl_buf key, const edl_delete_opts *o)
{
    cJSON *req = cJSON_CreateObject();
    txn_op(t, b, "request_delete_range", req, req ? delete_req(req, key, o) : 0);
}

static int op_result_parse(const cJSON *item, edl_op_result *r)
{
    const cJSON *x;
    memset(r, 0, sizeof *r);
    if ((x = cJSON_GetObjectItemCaseSensitive(item, "response_range"))) {
        r->type = EDL_OP_RANGE;
        return cJSON_IsObject(x) ? range_parse(x, &r->range) : EDL_EPROTO;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(item, "response_put"))) {
        r->type = EDL_OP_PUT;
        return cJSON_IsObject(x) ? put_parse(x, &r->put) : EDL_EPROTO;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(item, "response_delete_range"))) {
        r->type = EDL_OP_DELETE;
        return cJSON_IsObject(x) ? delete_parse(x, &r->del) : EDL_EPROTO;
    }
    return EDL_EPROTO;
}

static void op_result_clear(edl_op_result *r)
{
    edl_range_result_clear(&r->range);
    edl_put_result_clear(&r->put);
    edl_delete_result_clear(&r->del);
}

void edl_txn_result_clear(edl_txn_result *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_results; i++)
        op_result_clear(&r->results[i]);
    free(r->results);
    memset(r, 0, sizeof *r);
}

int txn_parse(const cJSON *resp, size_t expect_ops, edl_txn_result *r)
{
    int rc = header_revision(resp, &r->revision);
    if (!rc)
        rc = json_bool(resp, "succeeded", &r->succeeded);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(resp, "responses");
    if (rc || (arr && !cJSON_IsArray(arr)))
        return EDL_EPROTO;
    size_t n = arr ? (size_t)cJSON_GetArraySize(arr) : 0;
    if (n != expect_ops)
        return EDL_EPROTO;
    if (n && !(r->results = calloc(n, sizeof *r->results)))
        return EDL_ENOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if ((rc = op_result_parse(it, &r->results[r->n_results])) != 0) {
            op_result_clear(&r->results[r->n_results]);
            return rc;
        }
        r->n_results++;
    }
    return 0;
}

int edl_etcd_txn(edl_etcd *c, const edl_txn *t, edl_txn_result *res)
{
    memset(res, 0, sizeof *res);
    if (!t)
        return EDL_EINVAL;
    if (t->error)
        return etcd_fail(c, t->error, "txn: could not build the request (%s)", edl_strerror(t->error));
    cJSON *req = cJSON_Duplicate(t->body, 1), *resp;
    if (!req)
        return EDL_ENOMEM;
    /* A txn is not idempotent (its compares may hold once only): never re-sent blindly. */
    int rc = etcd_call(c, "/v3/kv/txn", req, &resp, edl_bytes(NULL, 0), false, 0);
    if (rc)
        return rc;
    bool succeeded = false;
    json_bool(resp, "succeeded", &succeeded);
    const char *branch = succeeded ? "success" : "failure";
    size_t ops = (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(t->body, branch));
    rc = txn_parse(resp, ops, res);
    cJSON_Delete(resp);
    if (rc) {
        edl_txn_result_clear(res);
        return etcd_fail(c, rc, "%s/v3/kv/txn: reply does not match the request (%s branch of %zu ops)",
                         edl_etcd_endpoint(c), branch, ops);
    }
    return 0;
}
