/* checkpoint_json.c: the JSON documents of a checkpoint, written and read defensively.
 *
 * Every document comes back from remote storage or etcd, where anything may have happened to
 * it (truncation, another program, a hostile writer), so every field is checked for type and
 * range before it is used: integers must be exact, sizes and counts bounded, keys valid and
 * inside the checkpoint's own directory, checksums 64 hex digits. */
#define _GNU_SOURCE
#include "checkpoint_internal.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ckpt_dir_name(int64_t step, int64_t generation, char *out, size_t len)
{
    snprintf(out, len, "ckpt-%016" PRId64 "-g%" PRId64, step, generation);
}

bool ckpt_dir_parse(const char *name, size_t len, int64_t *step, int64_t *generation)
{
    char buf[64];
    if (len < 8 || len >= sizeof buf || strncmp(name, "ckpt-", 5) != 0)
        return false;
    memcpy(buf, name, len);
    buf[len] = '\0';
    long long s, g;
    int used = 0;
    if (sscanf(buf, "ckpt-%16lld-g%lld%n", &s, &g, &used) != 2 || (size_t)used != len || s < 0 ||
        g < 0)
        return false;
    char again[64];
    ckpt_dir_name(s, g, again, sizeof again);
    if (strcmp(again, buf) != 0) /* only the canonical spelling is ours */
        return false;
    *step = s;
    *generation = g;
    return true;
}

int ckpt_sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32)
        return EDL_ENOMEM;
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* ---- reading helpers ------------------------------------------------------------------ */

__attribute__((format(printf, 3, 4)))
static int bad(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return EDL_EPROTO;
}

/* An exact integer in [lo, hi]. */
static bool get_int(const cJSON *o, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return false;
    *out = (int64_t)v->valuedouble;
    return true;
}

static const char *get_str(const cJSON *o, const char *name, size_t maxlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsString(v) || !v->valuestring || strlen(v->valuestring) > maxlen)
        return NULL;
    return v->valuestring;
}

static bool label_valid(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

static bool hex64(const char *s)
{
    if (!s || strlen(s) != 64)
        return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

void edl_ckpt_manifest_free(edl_ckpt_manifest *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_shards; i++) {
        free(m->shards[i].name);
        free(m->shards[i].key);
    }
    free(m->shards);
    free(m->dir);
    free(m->metadata_json);
    free(m);
}

/* The shard list of a document. rank >= 0: every shard must belong to that rank. */
static int parse_shards(const cJSON *root, edl_ckpt_manifest *m, int rank, char *err, size_t errlen)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "shards");
    if (!cJSON_IsArray(arr))
        return bad(err, errlen, "\"shards\" is missing or not an array");
    int n = cJSON_GetArraySize(arr);
    if (n < 0 || n > CKPT_MAX_SHARDS)
        return bad(err, errlen, "%d shards: more than the %d allowed", n, CKPT_MAX_SHARDS);
    m->shards = calloc(n ? (size_t)n : 1, sizeof *m->shards);
    if (!m->shards)
        return EDL_ENOMEM;
    size_t dlen = strlen(m->dir);
    uint64_t total = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        edl_ckpt_shard_info *s = &m->shards[m->n_shards];
        int64_t r = rank, idx, size;
        size_t at = m->n_shards;
        if (!cJSON_IsObject(e))
            return bad(err, errlen, "shard %zu is not an object", at);
        if ((rank < 0 && !get_int(e, "rank", 0, m->world_size - 1, &r)) ||
            (rank >= 0 && cJSON_GetObjectItemCaseSensitive(e, "rank") &&
             (!get_int(e, "rank", 0, CKPT_MAX_WORLD, &r) || r != rank)))
            return bad(err, errlen, "shard %zu: \"rank\" is missing or not in 0..%d", at,
                       m->world_size - 1);
        if (!get_int(e, "index", 0, CKPT_MAX_SHARDS, &idx))
            return bad(err, errlen, "shard %zu: \"index\" is missing or out of range", at);
        if (!get_int(e, "size", 0, (int64_t)CKPT_MAX_SHARD_SIZE, &size))
            return bad(err, errlen, "shard %zu: \"size\" is missing, not an integer or larger "
                       "than 1 PiB", at);
        const char *name = get_str(e, "name", 128), *key = get_str(e, "key", 512);
        const char *sum = get_str(e, "sha256", 64);
        if (!name || !label_valid(name))
            return bad(err, errlen, "shard %zu: \"name\" is missing or not a short label", at);
        if (!key || !edl_storage_key_valid(key) || strncmp(key, m->dir, dlen) != 0 ||
            key[dlen] != '/')
            return bad(err, errlen, "shard %zu: \"key\" is missing, invalid or outside %s", at,
                       m->dir);
        if (!hex64(sum))
            return bad(err, errlen, "shard %zu: \"sha256\" is not 64 lowercase hex digits", at);
        if (at > 0 && (m->shards[at - 1].rank > r ||
                       (m->shards[at - 1].rank == r && m->shards[at - 1].index >= idx)))
            return bad(err, errlen, "shard %zu: shards are not ordered by rank and index "
                       "(or one is listed twice)", at);
        total += (uint64_t)size;
        if (total > CKPT_MAX_SHARD_SIZE)
            return bad(err, errlen, "the shards add up to more than 1 PiB");
        s->rank = (int)r;
        s->index = (int)idx;
        s->size = (uint64_t)size;
        memcpy(s->sha256, sum, 65);
        m->n_shards++;
        if (!(s->name = strdup(name)) || !(s->key = strdup(key)))
            return EDL_ENOMEM;
    }
    return 0;
}

/* The fields every document shares: format, step, generation, world_size, dir. */
static int parse_common(const cJSON *root, const char *format, edl_ckpt_manifest *m, char *err,
                        size_t errlen)
{
    int64_t ws;
    if (!cJSON_IsObject(root))
        return bad(err, errlen, "not a JSON object (truncated or not a checkpoint document)");
    const char *f = get_str(root, "format", 64);
    if (!f || strcmp(f, format) != 0)
        return bad(err, errlen, "\"format\" is not \"%s\"", format);
    if (!get_int(root, "step", 0, CKPT_MAX_STEP, &m->step))
        return bad(err, errlen, "\"step\" is missing or not an integer in 0..2^53-1");
    if (!get_int(root, "generation", 0, CKPT_MAX_STEP, &m->generation))
        return bad(err, errlen, "\"generation\" is missing or not an integer in 0..2^53-1");
    if (!get_int(root, "world_size", 1, CKPT_MAX_WORLD, &ws))
        return bad(err, errlen, "\"world_size\" is missing or not in 1..%d", CKPT_MAX_WORLD);
    m->world_size = (int)ws;
    char dir[64];
    ckpt_dir_name(m->step, m->generation, dir, sizeof dir);
    const char *d = get_str(root, "dir", 63);
    if (!d || strcmp(d, dir) != 0)
        return bad(err, errlen, "\"dir\" is not \"%s\" (step and generation disagree)", dir);
    return (m->dir = strdup(dir)) ? 0 : EDL_ENOMEM;
}

int edl_ckpt_manifest_parse(const char *json, size_t len, edl_ckpt_manifest **out, char *err,
                            size_t errlen)
{
    if (!json || !out)
        return EDL_EINVAL;
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (len > CKPT_MAX_DOC)
        return bad(err, errlen, "manifest of %zu bytes is larger than the %u allowed", len,
                   CKPT_MAX_DOC);
    cJSON *root = cJSON_ParseWithLength(json, len);
    edl_ckpt_manifest *m = calloc(1, sizeof *m);
    int rc = m ? 0 : EDL_ENOMEM;
    if (rc == 0 && !root)
        rc = bad(err, errlen, "manifest is not valid JSON (truncated?)");
    if (rc == 0)
        rc = parse_common(root, CKPT_FORMAT, m, err, errlen);
    if (rc == 0)
        rc = parse_shards(root, m, -1, err, errlen);
    if (rc == 0) {
        const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
        if (meta && !cJSON_IsObject(meta))
            rc = bad(err, errlen, "\"metadata\" is not an object");
        else if (!(m->metadata_json = meta ? cJSON_PrintUnformatted(meta) : strdup("{}")))
            rc = EDL_ENOMEM;
    }
    /* every rank that saved must be represented: a rank with no shard at all is allowed (it
     * had nothing to save), but a shard of a rank beyond world_size is not (checked above) */
    cJSON_Delete(root);
    if (rc != 0) {
        edl_ckpt_manifest_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int ckpt_rank_doc_parse(const char *json, size_t len, int rank, const edl_ckpt_manifest *expect,
                        edl_ckpt_manifest **out, char *err, size_t errlen)
{
    *out = NULL;
    if (len > CKPT_MAX_DOC)
        return bad(err, errlen, "%zu bytes: too large", len);
    cJSON *root = cJSON_ParseWithLength(json, len);
    edl_ckpt_manifest *m = calloc(1, sizeof *m);
    int64_t r;
    int rc = m ? 0 : EDL_ENOMEM;
    if (rc == 0 && !root)
        rc = bad(err, errlen, "not valid JSON (truncated?)");
    if (rc == 0)
        rc = parse_common(root, CKPT_RANK_FORMAT, m, err, errlen);
    if (rc == 0 && (!get_int(root, "rank", 0, CKPT_MAX_WORLD, &r) || r != rank))
        rc = bad(err, errlen, "\"rank\" is not %d", rank);
    if (rc == 0 && (m->step != expect->step || m->generation != expect->generation ||
                    m->world_size != expect->world_size))
        rc = bad(err, errlen, "it is for step %" PRId64 " generation %" PRId64 " world size %d, "
                 "not step %" PRId64 " generation %" PRId64 " world size %d", m->step,
                 m->generation, m->world_size, expect->step, expect->generation,
                 expect->world_size);
    if (rc == 0)
        rc = parse_shards(root, m, rank, err, errlen);
    cJSON_Delete(root);
    if (rc != 0) {
        edl_ckpt_manifest_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* ---- writing ---------------------------------------------------------------------------- */

static cJSON *common_doc(const edl_ckpt_manifest *m, const char *format)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "format", format);
    cJSON_AddNumberToObject(o, "step", (double)m->step);
    cJSON_AddNumberToObject(o, "generation", (double)m->generation);
    cJSON_AddNumberToObject(o, "world_size", m->world_size);
    cJSON_AddStringToObject(o, "dir", m->dir);
    return o;
}

static bool add_shards(cJSON *o, const edl_ckpt_manifest *m, int rank)
{
    cJSON *arr = cJSON_AddArrayToObject(o, "shards");
    if (!arr)
        return false;
    for (size_t i = 0; i < m->n_shards; i++) {
        const edl_ckpt_shard_info *s = &m->shards[i];
        if (rank >= 0 && s->rank != rank)
            continue;
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(arr, e))
            return false;
        cJSON_AddNumberToObject(e, "rank", s->rank);
        cJSON_AddNumberToObject(e, "index", s->index);
        cJSON_AddStringToObject(e, "name", s->name ? s->name : "");
        cJSON_AddStringToObject(e, "key", s->key);
        cJSON_AddNumberToObject(e, "size", (double)s->size);
        cJSON_AddStringToObject(e, "sha256", s->sha256);
    }
    return true;
}

char *ckpt_rank_doc(const edl_ckpt_manifest *m, int rank)
{
    cJSON *o = common_doc(m, CKPT_RANK_FORMAT);
    char *s = NULL;
    if (o && cJSON_AddNumberToObject(o, "rank", rank) && add_shards(o, m, rank))
        s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

char *ckpt_manifest_doc(const edl_ckpt_manifest *m)
{
    cJSON *o = common_doc(m, CKPT_FORMAT);
    char *s = NULL;
    cJSON *meta = cJSON_Parse(m->metadata_json ? m->metadata_json : "{}");
    if (o && meta && cJSON_AddItemToObject(o, "metadata", meta)) {
        meta = NULL;
        if (add_shards(o, m, -1))
            s = cJSON_Print(o); /* indented: people read manifests */
    }
    cJSON_Delete(meta);
    cJSON_Delete(o);
    return s;
}

/* ---- the pointer ---------------------------------------------------------------------- */

void ckpt_pointer_clear(ckpt_pointer *p)
{
    free(p->entries);
    p->entries = NULL;
    p->n = 0;
}

int ckpt_pointer_parse(const char *json, size_t len, ckpt_pointer *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    cJSON *root = cJSON_ParseWithLength(json, len);
    const cJSON *hist = root ? cJSON_GetObjectItemCaseSensitive(root, "history") : NULL;
    int rc = 0;
    if (!cJSON_IsObject(root))
        rc = bad(err, errlen, "the pointer is not a JSON object");
    else if (!cJSON_IsArray(hist) || cJSON_GetArraySize(hist) < 1 ||
             cJSON_GetArraySize(hist) > 1000)
        rc = bad(err, errlen, "the pointer has no \"history\" list of 1..1000 entries");
    if (rc == 0 && !(p->entries = calloc((size_t)cJSON_GetArraySize(hist), sizeof *p->entries)))
        rc = EDL_ENOMEM;
    const cJSON *e;
    if (rc == 0) {
        cJSON_ArrayForEach(e, hist) {
            ckpt_pointer_entry *x = &p->entries[p->n];
            const char *dir = get_str(e, "dir", sizeof x->dir - 1);
            if (!get_int(e, "step", 0, CKPT_MAX_STEP, &x->step) ||
                !get_int(e, "generation", 0, CKPT_MAX_STEP, &x->generation) || !dir) {
                rc = bad(err, errlen, "pointer history entry %zu is malformed", p->n);
                break;
            }
            ckpt_dir_name(x->step, x->generation, x->dir, sizeof x->dir);
            if (strcmp(dir, x->dir) != 0) {
                rc = bad(err, errlen, "pointer history entry %zu: dir is not %s", p->n, x->dir);
                break;
            }
            p->n++;
        }
    }
    int64_t step;
    if (rc == 0 && (!get_int(root, "step", 0, CKPT_MAX_STEP, &step) || step != p->entries[0].step))
        rc = bad(err, errlen, "the pointer's \"step\" disagrees with its history");
    cJSON_Delete(root);
    if (rc != 0)
        ckpt_pointer_clear(p);
    return rc;
}

char *ckpt_pointer_doc(const char *uri, const ckpt_pointer *old, int64_t step, int64_t generation,
                       int keep)
{
    char dir[64], manifest[96];
    ckpt_dir_name(step, generation, dir, sizeof dir);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", dir);
    cJSON *o = cJSON_CreateObject();
    cJSON *hist = o ? cJSON_CreateArray() : NULL;
    char *s = NULL;
    if (!hist) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "generation", (double)generation);
    cJSON_AddStringToObject(o, "uri", uri);
    cJSON_AddStringToObject(o, "dir", dir);
    cJSON_AddStringToObject(o, "manifest", manifest);
    cJSON_AddItemToObject(o, "history", hist);
    for (int i = -1; i < (int)(old ? old->n : 0) && cJSON_GetArraySize(hist) < keep; i++) {
        cJSON *e = cJSON_CreateObject();
        if (!e)
            break;
        cJSON_AddNumberToObject(e, "step", (double)(i < 0 ? step : old->entries[i].step));
        cJSON_AddNumberToObject(e, "generation",
                                (double)(i < 0 ? generation : old->entries[i].generation));
        cJSON_AddStringToObject(e, "dir", i < 0 ? dir : old->entries[i].dir);
        cJSON_AddItemToArray(hist, e);
    }
    s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
