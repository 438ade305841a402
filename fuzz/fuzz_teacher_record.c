/* fuzz_teacher_record.c: feeds every input as a teacher's key-value in etcd, which any writer
 * may put there, to what a student reads it with (discovery/service.c): the record (the value)
 * to edl_service_instance_parse, and the key and value together to disc_teacher_from_kv, as the
 * listing and the watch of a service meet them. The input is the key's name, a '\n', then the
 * value (no '\n': the value alone, under the name "t-0"). Asserts beyond "no crash": a refusal
 * says why and leaves the caller's instance as it was; a record taken has an http(s) endpoint,
 * a capacity in 1..65535, a finite load >= 0 and strings; written back it parses to the same
 * fields and is written the same; a key-value is taken exactly when its name is a valid name
 * and its record parses. */
#include "fuzz.h"

#include <math.h>

#include "discovery/internal.h"

#define DIR "/edl/v1/services/svc/teachers/"

static bool same(const edl_service_instance *a, const edl_service_instance *b)
{
    return fuzz_streq(a->name, b->name) && fuzz_streq(a->endpoint, b->endpoint) &&
           a->capacity == b->capacity && fuzz_streq(a->model, b->model) &&
           fuzz_streq(a->version, b->version) && a->load == b->load;
}

/* The record: parsed, written, parsed again to the same, written the same. */
static bool check_record(const char *name, const char *value, size_t len)
{
    char err[256] = "";
    edl_service_instance in = {.capacity = 7}, again = {0};
    int rc = edl_service_instance_parse(name, value, len, &in, err, sizeof err);
    if (rc) {
        FUZZ_CHECK(rc == EDL_EPROTO && err[0] && in.capacity == 7 && !in.endpoint);
        return false;
    }
    FUZZ_CHECK(in.endpoint && (!strncmp(in.endpoint, "http://", 7) ||
                               !strncmp(in.endpoint, "https://", 8)));
    FUZZ_CHECK(in.capacity >= 1 && in.capacity <= 65535 && in.load >= 0 && isfinite(in.load));
    FUZZ_CHECK(in.model && in.version && fuzz_streq(in.name, name));
    char *json = NULL, *json2 = NULL;
    FUZZ_CHECK(edl_service_instance_to_json(&in, &json) == 0);
    FUZZ_CHECK(edl_service_instance_parse(name, json, strlen(json), &again, err, sizeof err) == 0);
    FUZZ_CHECK(same(&in, &again));
    FUZZ_CHECK(edl_service_instance_to_json(&again, &json2) == 0 && strcmp(json, json2) == 0);
    free(json), free(json2);
    edl_service_instance_clear(&in);
    edl_service_instance_clear(&again);
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    const uint8_t *nl = memchr(data, '\n', size);
    size_t nlen = nl ? (size_t)(nl - data) : 3, vlen = nl ? size - nlen - 1 : size;
    const uint8_t *v = nl ? nl + 1 : data;
    char *name = fuzz_cstr(nl ? data : (const uint8_t *)"t-0", nlen);
    char *value = fuzz_cstr(v, vlen);
    char *key = malloc(sizeof DIR + nlen);
    if (!key)
        abort();
    memcpy(key, DIR, sizeof DIR - 1);
    memcpy(key + sizeof DIR - 1, name, nlen + 1);
    bool named = strlen(name) == nlen && edl_service_name_ok(name);
    bool record = check_record(named ? name : "t-0", value, vlen);
    edl_kv kv = {.key = key, .key_len = sizeof DIR - 1 + nlen, .value = value,
                 .value_len = vlen, .lease = 0x1234};
    edl_service_instance t = {0};
    int rc = disc_teacher_from_kv(&kv, DIR, &t);
    FUZZ_CHECK((rc == 0) == (named && record));
    FUZZ_CHECK(rc == 0 ? fuzz_streq(t.name, name) && t.lease == 0x1234 : t.name == NULL);
    FUZZ_CHECK(rc == 0 || rc == EDL_EPROTO);
    edl_service_instance_clear(&t);
    free(key), free(name), free(value);
    return 0;
}
