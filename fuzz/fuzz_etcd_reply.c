/* fuzz_etcd_reply.c: feeds every input, as the client reads a reply body (etcd/client.c:
 * whole buffer, trailing bytes refused), to the etcd client's reply decoders: range, put,
 * delete, txn (etcd/kv.c), the lease replies' fields (grant, keepalive, timetolive:
 * etcd/lease.c reads them with json_i64), a key-value record, and the raw bytes to the strict
 * base64 decoder (etcd/codec.c). Asserts beyond "no crash": a range reply that parses,
 * written back with the client's own encoders, parses to the same result; base64 decoding
 * inverts encoding both ways; a parsed count is never below the key-values returned. */
#include "fuzz.h"

#include "etcd/internal.h"

static void check_b64(const uint8_t *data, size_t size)
{
    char *enc, *dec, *again;
    size_t n, n2;
    FUZZ_CHECK(b64_encode((const char *)data, size, &enc) == 0);
    FUZZ_CHECK(b64_decode(enc, strlen(enc), &dec, &n) == 0);
    FUZZ_CHECK(n == size && memcmp(dec, data, size) == 0);
    free(enc);
    free(dec);
    if (b64_decode((const char *)data, size, &dec, &n) != 0)
        return;
    FUZZ_CHECK(n <= size / 4 * 3);
    FUZZ_CHECK(b64_encode(dec, n, &enc) == 0);
    FUZZ_CHECK(b64_decode(enc, strlen(enc), &again, &n2) == 0);
    FUZZ_CHECK(n2 == n && memcmp(again, dec, n) == 0);
    free(enc);
    free(dec);
    free(again);
}

static cJSON *kv_json(const edl_kv *kv)
{
    cJSON *o = cJSON_CreateObject();
    FUZZ_CHECK(o && json_add_b64(o, "key", edl_bytes(kv->key, kv->key_len)) &&
               json_add_b64(o, "value", edl_bytes(kv->value, kv->value_len)) &&
               json_add_i64(o, "create_revision", kv->create_revision) &&
               json_add_i64(o, "mod_revision", kv->mod_revision) &&
               json_add_i64(o, "version", kv->version) && json_add_i64(o, "lease", kv->lease));
    return o;
}

static bool kv_equal(const edl_kv *a, const edl_kv *b)
{
    return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0 &&
           a->value_len == b->value_len && memcmp(a->value, b->value, a->value_len) == 0 &&
           a->create_revision == b->create_revision && a->mod_revision == b->mod_revision &&
           a->version == b->version && a->lease == b->lease;
}

/* A parsed range result, written as the gateway would, parses back the same. */
static void range_round_trip(const edl_range_result *r)
{
    cJSON *o = cJSON_CreateObject(), *h = cJSON_CreateObject(), *kvs = cJSON_CreateArray();
    FUZZ_CHECK(o && h && kvs);
    cJSON_AddItemToObject(o, "header", h);
    cJSON_AddItemToObject(o, "kvs", kvs);
    FUZZ_CHECK(json_add_i64(h, "revision", r->revision) && json_add_i64(o, "count", r->count) &&
               cJSON_AddBoolToObject(o, "more", r->more));
    for (size_t i = 0; i < r->n_kvs; i++)
        cJSON_AddItemToArray(kvs, kv_json(&r->kvs[i]));
    edl_range_result b;
    FUZZ_CHECK(range_parse(o, &b) == 0);
    FUZZ_CHECK(b.revision == r->revision && b.count == r->count && b.more == r->more &&
               b.n_kvs == r->n_kvs);
    for (size_t i = 0; i < r->n_kvs; i++)
        FUZZ_CHECK(kv_equal(&r->kvs[i], &b.kvs[i]));
    edl_range_result_clear(&b);
    cJSON_Delete(o);
}

static void replies(const cJSON *j)
{
    edl_range_result rr;
    if (range_parse(j, &rr) == 0) {
        FUZZ_CHECK(rr.count >= 0 && (size_t)rr.count >= rr.n_kvs);
        range_round_trip(&rr);
        edl_range_result_clear(&rr);
    }
    edl_put_result pr;
    if (put_parse(j, &pr) == 0)
        edl_put_result_clear(&pr);
    else
        FUZZ_CHECK(!pr.prev_kv);
    edl_delete_result dr;
    if (delete_parse(j, &dr) == 0)
        edl_delete_result_clear(&dr);
    const cJSON *resps = cJSON_GetObjectItemCaseSensitive(j, "responses");
    edl_txn_result tr = {0};
    size_t ops = cJSON_IsArray(resps) ? (size_t)cJSON_GetArraySize(resps) : 0;
    if (txn_parse(j, ops, &tr) == 0)
        FUZZ_CHECK(tr.n_results == ops);
    edl_txn_result_clear(&tr);
    edl_kv kv;
    if (kv_parse(j, &kv) == 0)
        kv_clear(&kv);
}

/* The lease calls read their replies field by field (etcd/lease.c). */
static void lease_replies(const cJSON *j)
{
    int64_t v;
    json_i64(j, "ID", &v);
    json_i64(j, "TTL", &v);
    json_i64(j, "grantedTTL", &v);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(j, "result");
    if (cJSON_IsObject(res))
        json_i64(res, "TTL", &v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    check_b64(data, size);
    char *body = fuzz_cstr(data, size);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, size + 1, &end, 1);
    if (cJSON_IsObject(j)) {
        replies(j);
        lease_replies(j);
    }
    cJSON_Delete(j);
    free(body);
    return 0;
}
