/* keys.c: the etcd key names of a job (edl/job.h), built and recognised in this one place, so
 * that the agent, the job server, the `edl` command, the collective library and the checkpoint
 * code cannot disagree about where a document lives. */
#define _GNU_SOURCE /* asprintf */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/job.h"

bool edl_name_valid(const char *name)
{
    if (!name || !*name || name[0] == '.' || name[0] == '-')
        return false;
    size_t n = 0;
    for (const char *p = name; *p; p++, n++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '.' || ch == '_' || ch == '-';
        if (!ok || n >= EDL_NAME_MAX)
            return false;
    }
    return true;
}

static char *join(const char *base, const char *rest)
{
    char *k = NULL;
    return asprintf(&k, "%s%s", base, rest) < 0 ? NULL : k;
}

void edl_job_keys_clear(edl_job_keys *k)
{
    char **all[] = {&k->job, &k->spec, &k->pods, &k->status, &k->leader, &k->generation,
                    &k->gens, &k->checkpoint};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        free(*all[i]);
        *all[i] = NULL;
    }
}

bool edl_prefix_valid(const char *prefix)
{
    return prefix && prefix[0] == '/' && !strpbrk(prefix, "\r\n");
}

int edl_job_keys_init(edl_job_keys *k, const char *prefix, const char *job)
{
    memset(k, 0, sizeof *k);
    if (!prefix)
        prefix = EDL_DEFAULT_PREFIX;
    if (!edl_name_valid(job) || !edl_prefix_valid(prefix))
        return EDL_EINVAL;
    size_t plen = strlen(prefix);
    while (plen && prefix[plen - 1] == '/')
        plen--;
    if (asprintf(&k->job, "%.*s/jobs/%s/", (int)plen, prefix, job) < 0) {
        k->job = NULL;
        return EDL_ENOMEM;
    }
    k->spec = join(k->job, "spec");
    k->pods = join(k->job, "pods/");
    k->status = join(k->job, "status/");
    k->leader = join(k->job, "leader");
    k->generation = join(k->job, "generation");
    k->gens = join(k->job, "gen/");
    k->checkpoint = join(k->job, "checkpoint");
    if (!k->spec || !k->pods || !k->status || !k->leader || !k->generation || !k->gens ||
        !k->checkpoint) {
        edl_job_keys_clear(k);
        return EDL_ENOMEM;
    }
    return 0;
}

char *edl_job_key_pod(const edl_job_keys *k, const char *pod)
{
    return join(k->pods, pod);
}

char *edl_job_key_status(const edl_job_keys *k, const char *pod)
{
    return join(k->status, pod);
}

char *edl_job_key_gen(const edl_job_keys *k, int64_t gen, const char *name)
{
    char *key = NULL;
    if (asprintf(&key, "%s%" PRId64 "/%s", k->gens, gen, name ? name : "") < 0)
        return NULL;
    return key;
}

/* key[0..len) starts with prefix: the length of what follows, else -1. */
static long after(const char *key, size_t len, const char *prefix)
{
    size_t pl = strlen(prefix);
    return len >= pl && memcmp(key, prefix, pl) == 0 ? (long)(len - pl) : -1;
}

static bool is(const char *key, size_t len, const char *full)
{
    return strlen(full) == len && memcmp(key, full, len) == 0;
}

/* "<n>/<name>" with n canonical decimal (no sign, no leading zero) up to the maximum. */
static bool parse_gen(const char *s, size_t len, edl_job_key_info *out)
{
    size_t i = 0;
    int64_t n = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9' && i < 16) {
        n = n * 10 + (s[i] - '0');
        i++;
    }
    if (i == 0 || i >= len || s[i] != '/' || (s[0] == '0' && i > 1) || n > EDL_GENERATION_MAX)
        return false;
    out->gen = n;
    out->name = s + i + 1;
    out->name_len = len - i - 1;
    return true;
}

edl_job_key_kind edl_job_key_parse(const edl_job_keys *k, const char *key, size_t len,
                                   edl_job_key_info *out)
{
    memset(out, 0, sizeof *out);
    long rest = 0;
    if (is(key, len, k->spec))
        out->kind = EDL_KEY_SPEC;
    else if (is(key, len, k->leader))
        out->kind = EDL_KEY_LEADER;
    else if (is(key, len, k->generation))
        out->kind = EDL_KEY_GENERATION;
    else if (is(key, len, k->checkpoint))
        out->kind = EDL_KEY_CHECKPOINT;
    else if ((rest = after(key, len, k->pods)) > 0)
        out->kind = EDL_KEY_POD;
    else if ((rest = after(key, len, k->status)) > 0)
        out->kind = EDL_KEY_STATUS;
    else if ((rest = after(key, len, k->gens)) > 0 &&
             parse_gen(key + len - (size_t)rest, (size_t)rest, out))
        out->kind = EDL_KEY_GEN;
    if (out->kind == EDL_KEY_POD || out->kind == EDL_KEY_STATUS) {
        out->name = key + len - (size_t)rest;
        out->name_len = (size_t)rest;
    }
    return out->kind;
}

bool edl_job_key_is_gen(const edl_job_key_info *info, int64_t gen, const char *name)
{
    return info->kind == EDL_KEY_GEN && info->gen == gen && strlen(name) == info->name_len &&
           memcmp(info->name, name, info->name_len) == 0;
}

bool edl_job_key_gen_rank(const edl_job_key_info *info, int64_t gen, const char *prefix,
                          int *rank)
{
    size_t pl = strlen(prefix), n = info->name_len - pl;
    if (info->kind != EDL_KEY_GEN || info->gen != gen || info->name_len <= pl || n > 10 ||
        memcmp(info->name, prefix, pl) != 0)
        return false;
    const char *d = info->name + pl;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] < '0' || d[i] > '9' || (i == 0 && d[i] == '0' && n > 1))
            return false;
        v = v * 10 + (d[i] - '0');
    }
    if (v > INT32_MAX)
        return false;
    *rank = (int)v;
    return true;
}
