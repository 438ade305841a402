/* checkpoint_docs.c: the JSON documents of a checkpoint, written and read defensively.
 *
 * Every document comes back from remote storage or etcd, where anything may have happened to
 * it (truncation, another program, a hostile writer), so every field is checked for type and
 * range before it is used: integers must be exact, sizes and counts bounded, keys valid and
 * inside the checkpoint's own directory, digests of a known algorithm and its length in hex.
 *
 * A shard names its digest as "hash": "xxh3-128" (or "sha256") and "digest": "<hex>"; shards of
 * checkpoints written before XXH3 (format /1) carry "sha256": "<64 hex>" instead, and load. */
#define _GNU_SOURCE
#include "checkpoint_internal.h"
#include "edl/json.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
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

/* ---- reading ------------------------------------------------------------------------- */

/* A malformed document: the message, and EDL_EPROTO. */
#define bad(err, errlen, ...) edl_errf(err, errlen, EDL_EPROTO, __VA_ARGS__)

/* Whatever the reader found wrong is a malformed document here (EDL_EPROTO), except memory. */
static int reader_rc(const edl_json_reader *r)
{
    return r->rc == 0 || r->rc == EDL_ENOMEM ? r->rc : EDL_EPROTO;
}

static bool label_valid(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

static bool hex_of(const char *s, size_t len)
{
    if (!s || strlen(s) != len)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* The shard's digest: "hash" and "digest", or the "sha256" of a checkpoint before XXH3. */
static int parse_digest(edl_json_reader *r, edl_ckpt_shard_info *s)
{
    const char *alg = NULL, *sum = NULL;
    r->required = false;
    edl_json_cstr(r, "hash", 32, &alg);
    r->required = true;
    if (r->rc)
        return reader_rc(r);
    if (!alg) {
        s->hash = EDL_CKPT_SHA256;
        edl_json_cstr(r, "sha256", 64, &sum);
    } else if (!ckpt_hash_parse(alg, &s->hash)) {
        return bad(r->err, r->errlen, "%s: \"hash\" names no known algorithm (xxh3-128, "
                   "sha256)", r->doc);
    } else {
        edl_json_cstr(r, "digest", 64, &sum);
    }
    if (r->rc)
        return reader_rc(r);
    size_t n = ckpt_hash_hex_len(s->hash);
    if (!hex_of(sum, n))
        return bad(r->err, r->errlen, "%s: \"%s\" is not %zu lowercase hex digits", r->doc,
                   alg ? "digest" : "sha256", n);
    memcpy(s->digest, sum, n + 1);
    return 0;
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
    free(m->run);
    free(m);
}

/* One shard entry (an object) into s. rank >= 0: it must belong to that rank. */
static int parse_shard(edl_json_reader *r, const edl_ckpt_manifest *m, int rank,
                       edl_ckpt_shard_info *s)
{
    int64_t rk = rank, idx = 0, size = 0;
    const char *name = NULL, *key = NULL;
    r->required = rank < 0; /* in a rank's own document, its shards may leave "rank" out */
    edl_json_i64(r, "rank", rank < 0 ? 0 : rank, rank < 0 ? m->world_size - 1 : rank, &rk);
    r->required = true;
    edl_json_i64(r, "index", 0, CKPT_MAX_SHARDS, &idx);
    edl_json_i64(r, "size", 0, (int64_t)CKPT_MAX_SHARD_SIZE, &size);
    edl_json_cstr(r, "name", 128, &name);
    edl_json_cstr(r, "key", 512, &key);
    if (r->rc)
        return reader_rc(r);
    size_t dlen = strlen(m->dir);
    if (!label_valid(name))
        return bad(r->err, r->errlen, "%s: \"name\" is not a short label", r->doc);
    if (!edl_storage_key_valid(key))
        return bad(r->err, r->errlen, "%s: \"key\" is not a valid storage key", r->doc);
    if (strncmp(key, m->dir, dlen) != 0 || key[dlen] != '/')
        return bad(r->err, r->errlen, "%s: \"key\" is outside %s", r->doc, m->dir);
    int rc = parse_digest(r, s);
    if (rc)
        return rc;
    s->rank = (int)rk;
    s->index = (int)idx;
    s->size = (uint64_t)size;
    return (s->name = strdup(name)) && (s->key = strdup(key)) ? 0 : EDL_ENOMEM;
}

/* The shard list of a document. rank >= 0: every shard must belong to that rank. */
static int parse_shards(edl_json_reader *root, edl_ckpt_manifest *m, int rank)
{
    const cJSON *arr = edl_json_array(root, "shards", CKPT_MAX_SHARDS);
    if (!arr)
        return reader_rc(root);
    m->shards = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *m->shards);
    if (!m->shards)
        return EDL_ENOMEM;
    uint64_t total = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        size_t at = m->n_shards;
        char doc[48];
        snprintf(doc, sizeof doc, "shard %zu", at);
        if (!cJSON_IsObject(e))
            return bad(root->err, root->errlen, "%s is not an object", doc);
        edl_json_reader r = {e, doc, root->err, root->errlen, 0, true};
        edl_ckpt_shard_info *s = &m->shards[m->n_shards++];
        int rc = parse_shard(&r, m, rank, s);
        if (rc)
            return rc;
        if (at > 0 && (m->shards[at - 1].rank > s->rank ||
                       (m->shards[at - 1].rank == s->rank && m->shards[at - 1].index >= s->index)))
            return bad(root->err, root->errlen, "shard %zu: shards are not ordered by rank and "
                       "index (or one is listed twice)", at);
        if ((total += s->size) > CKPT_MAX_SHARD_SIZE)
            return bad(root->err, root->errlen, "the shards add up to more than 1 PiB");
    }
    return 0;
}

/* The fields every document shares: format (this code's or the one before, old_format),
 * step, generation, world_size, dir. */
static int parse_common(edl_json_reader *r, const char *format, const char *old_format,
                        edl_ckpt_manifest *m)
{
    const char *f = NULL, *d = NULL;
    r->required = true;
    edl_json_cstr(r, "format", 64, &f);
    if (!r->rc && (!f || (strcmp(f, format) != 0 && strcmp(f, old_format) != 0)))
        return bad(r->err, r->errlen, "%s: \"format\" is neither \"%s\" nor \"%s\"", r->doc,
                   format, old_format);
    edl_json_i64(r, "step", 0, CKPT_MAX_STEP, &m->step);
    edl_json_i64(r, "generation", 0, CKPT_MAX_STEP, &m->generation);
    edl_json_int(r, "world_size", 1, CKPT_MAX_WORLD, &m->world_size);
    edl_json_cstr(r, "dir", 63, &d);
    r->required = false;
    edl_json_str(r, "run", CKPT_MAX_RUN, &m->run); /* absent from documents before runs */
    r->required = true;
    if (r->rc)
        return reader_rc(r);
    char dir[64];
    ckpt_dir_name(m->step, m->generation, dir, sizeof dir);
    if (strcmp(d, dir) != 0)
        return bad(r->err, r->errlen, "%s: \"dir\" is not \"%s\" (step and generation "
                   "disagree)", r->doc, dir);
    return (m->dir = strdup(dir)) ? 0 : EDL_ENOMEM;
}

/* Parse the object of a manifest or rank document into a new manifest structure. */
static cJSON *parse_root(const char *json, size_t len, const char *doc, edl_ckpt_manifest **m,
                         char *err, size_t errlen, int *rc)
{
    if (err && errlen)
        err[0] = '\0';
    cJSON *root = edl_json_parse_object(json, len, CKPT_MAX_DOC, doc, err, errlen, rc);
    if (!root)
        return NULL;
    if (!(*m = calloc(1, sizeof **m))) {
        cJSON_Delete(root);
        *rc = EDL_ENOMEM;
        return NULL;
    }
    return root;
}

int edl_ckpt_manifest_parse(const char *json, size_t len, edl_ckpt_manifest **out, char *err,
                            size_t errlen)
{
    if (!json || !out)
        return EDL_EINVAL;
    *out = NULL;
    edl_ckpt_manifest *m = NULL;
    int rc;
    cJSON *root = parse_root(json, len, "manifest", &m, err, errlen, &rc);
    if (!root)
        return rc;
    edl_json_reader r = {root, "manifest", err, errlen, 0};
    rc = parse_common(&r, CKPT_FORMAT, CKPT_FORMAT_V1, m);
    if (rc == 0)
        rc = parse_shards(&r, m, -1);
    r.required = false;
    const cJSON *meta = rc == 0 ? edl_json_object(&r, "metadata") : NULL;
    if (rc == 0 && (rc = reader_rc(&r)) == 0 &&
        !(m->metadata_json = meta ? edl_json_print(meta, false) : strdup("{}")))
        rc = EDL_ENOMEM;
    /* a rank with no shard at all is allowed (it had nothing to save); a shard of a rank
     * beyond world_size is not (parse_shard checks it) */
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
    edl_ckpt_manifest *m = NULL;
    int rc;
    cJSON *root = parse_root(json, len, "rank document", &m, err, errlen, &rc);
    if (!root)
        return rc;
    edl_json_reader r = {root, "rank document", err, errlen, 0};
    int64_t rk = -1;
    rc = parse_common(&r, CKPT_RANK_FORMAT, CKPT_RANK_FORMAT_V1, m);
    if (rc == 0)
        edl_json_i64(&r, "rank", 0, CKPT_MAX_WORLD, &rk);
    if (rc == 0 && (r.rc || rk != rank))
        rc = bad(err, errlen, "\"rank\" is not %d", rank);
    if (rc == 0 && (m->step != expect->step || m->generation != expect->generation ||
                    m->world_size != expect->world_size))
        rc = bad(err, errlen, "it is for step %" PRId64 " generation %" PRId64 " world size %d, "
                 "not step %" PRId64 " generation %" PRId64 " world size %d", m->step,
                 m->generation, m->world_size, expect->step, expect->generation,
                 expect->world_size);
    if (rc == 0 && expect->run && m->run && strcmp(m->run, expect->run) != 0)
        rc = bad(err, errlen, "it was written by run %s of the job, not by this run (%s): a save "
                 "that an earlier run left half done", m->run, expect->run);
    if (rc == 0)
        rc = parse_shards(&r, m, rank);
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
    if (m->run)
        cJSON_AddStringToObject(o, "run", m->run);
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
        cJSON_AddStringToObject(e, "hash", ckpt_hash_name(s->hash));
        cJSON_AddStringToObject(e, "digest", s->digest);
    }
    return true;
}

char *ckpt_rank_doc(const edl_ckpt_manifest *m, int rank)
{
    cJSON *o = common_doc(m, CKPT_RANK_FORMAT);
    char *s = NULL;
    if (o && cJSON_AddNumberToObject(o, "rank", rank) && add_shards(o, m, rank))
        s = edl_json_print(o, false);
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
            s = edl_json_print(o, true); /* indented: people read manifests */
    }
    cJSON_Delete(meta);
    cJSON_Delete(o);
    return s;
}

/* ---- the pointer ---------------------------------------------------------------------- */

void ckpt_pointer_clear(ckpt_pointer *p)
{
    free(p->entries);
    free(p->uri);
    p->entries = NULL;
    p->uri = NULL;
    p->n = 0;
}

/* One history entry: step, generation and the canonical dir of the two. */
static int parse_pointer_entry(edl_json_reader *r, ckpt_pointer_entry *x)
{
    const char *dir = NULL;
    edl_json_i64(r, "step", 0, CKPT_MAX_STEP, &x->step);
    edl_json_i64(r, "generation", 0, CKPT_MAX_STEP, &x->generation);
    edl_json_cstr(r, "dir", sizeof x->dir - 1, &dir);
    if (r->rc)
        return reader_rc(r);
    ckpt_dir_name(x->step, x->generation, x->dir, sizeof x->dir);
    if (strcmp(dir, x->dir) != 0)
        return bad(r->err, r->errlen, "%s: dir is not %s", r->doc, x->dir);
    return 0;
}

int ckpt_pointer_parse(const char *json, size_t len, ckpt_pointer *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    int rc;
    cJSON *root = edl_json_parse_object(json, len, CKPT_MAX_DOC, "the pointer", err, errlen, &rc);
    if (!root)
        return rc == EDL_ENOMEM ? rc : EDL_EPROTO;
    edl_json_reader r = {root, "the pointer", err, errlen, 0, true};
    const cJSON *hist = edl_json_array(&r, "history", 1000);
    int64_t step = -1;
    edl_json_i64(&r, "step", 0, CKPT_MAX_STEP, &step);
    rc = reader_rc(&r);
    if (rc == 0 && cJSON_GetArraySize(hist) < 1)
        rc = bad(err, errlen, "the pointer's \"history\" is empty");
    if (rc == 0 && !(p->entries = calloc((size_t)cJSON_GetArraySize(hist), sizeof *p->entries)))
        rc = EDL_ENOMEM;
    const cJSON *e, *items = rc == 0 ? hist : NULL;
    cJSON_ArrayForEach(e, items) {
        char doc[48];
        snprintf(doc, sizeof doc, "pointer history entry %zu", p->n);
        edl_json_reader er = {e, doc, err, errlen, 0, true};
        if (!cJSON_IsObject(e))
            rc = bad(err, errlen, "%s is malformed", doc);
        else
            rc = parse_pointer_entry(&er, &p->entries[p->n]);
        if (rc)
            break;
        p->n++;
    }
    if (rc == 0 && step != p->entries[0].step)
        rc = bad(err, errlen, "the pointer's \"step\" disagrees with its history");
    const cJSON *uri = cJSON_GetObjectItemCaseSensitive(root, "uri");
    if (rc == 0 && cJSON_IsString(uri) && !(p->uri = strdup(uri->valuestring)))
        rc = EDL_ENOMEM;
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
    s = edl_json_print(o, false);
    cJSON_Delete(o);
    return s;
}
