/* fuzz_checkpoint_docs.c: feeds every input to the readers of a checkpoint's documents
 * (storage/checkpoint_docs.c): the manifest, a rank's shard list (for the rank, step,
 * generation and world size the input itself names, so that the checks past them are
 * reached), the etcd pointer, and the input as a checkpoint directory name. Asserts beyond
 * "no crash": each document that parses is one JSON object with nothing after it, and is
 * written back by its writer to a document that parses and is written the same; a pointer rebuilt from its own history is the same pointer;
 * a directory name that parses is the canonical name of what it parsed to. */
#include "fuzz.h"

#include <cjson/cJSON.h>

#include "storage/checkpoint_internal.h"

static void manifest(const char *in, size_t len)
{
    edl_ckpt_manifest *a = NULL, *b = NULL;
    char err[256];
    if (edl_ckpt_manifest_parse(in, len, &a, err, sizeof err) != 0)
        return;
    FUZZ_CHECK(fuzz_one_json((const uint8_t *)in, len));
    char *d1 = ckpt_manifest_doc(a);
    FUZZ_CHECK(d1);
    FUZZ_CHECK(edl_ckpt_manifest_parse(d1, strlen(d1), &b, err, sizeof err) == 0);
    char *d2 = ckpt_manifest_doc(b);
    FUZZ_CHECK(d2 && strcmp(d1, d2) == 0);
    for (size_t i = 0; i < a->n_shards; i++)
        FUZZ_CHECK(edl_ckpt_find_shard(a, a->shards[i].rank, a->shards[i].index) == (long)i);
    free(d1);
    free(d2);
    edl_ckpt_manifest_free(a);
    edl_ckpt_manifest_free(b);
}

/* The number field name of the input when it is one in [0, 2^53), else -1. */
static double field(const cJSON *j, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, name);
    return cJSON_IsNumber(f) && f->valuedouble >= 0 && f->valuedouble < 9007199254740992.0
               ? f->valuedouble
               : -1;
}

static void rank_doc(const char *in, size_t len)
{
    cJSON *j = cJSON_ParseWithLength(in, len);
    double rank = field(j, "rank");
    double world = field(j, "world_size");
    edl_ckpt_manifest expect = {.step = (int64_t)field(j, "step"),
                                .generation = (int64_t)field(j, "generation"),
                                .world_size = world <= CKPT_MAX_WORLD ? (int)world : -1};
    cJSON_Delete(j);
    if (!(rank >= 0 && rank < CKPT_MAX_WORLD))
        rank = 0; /* the reader refuses it further on; still exercised */
    edl_ckpt_manifest *a = NULL, *b = NULL;
    char err[256];
    if (ckpt_rank_doc_parse(in, len, (int)rank, &expect, &a, err, sizeof err) != 0)
        return;
    FUZZ_CHECK(fuzz_one_json((const uint8_t *)in, len));
    char *d1 = ckpt_rank_doc(a, (int)rank);
    FUZZ_CHECK(d1);
    FUZZ_CHECK(ckpt_rank_doc_parse(d1, strlen(d1), (int)rank, a, &b, err, sizeof err) == 0);
    char *d2 = ckpt_rank_doc(b, (int)rank);
    FUZZ_CHECK(d2 && strcmp(d1, d2) == 0);
    free(d1);
    free(d2);
    edl_ckpt_manifest_free(a);
    edl_ckpt_manifest_free(b);
}

static void pointer(const char *in, size_t len)
{
    ckpt_pointer a, b;
    char err[256];
    if (ckpt_pointer_parse(in, len, &a, err, sizeof err) != 0)
        return;
    FUZZ_CHECK(fuzz_one_json((const uint8_t *)in, len));
    FUZZ_CHECK(a.n >= 1 && a.entries);
    ckpt_pointer older = {a.entries + 1, a.n - 1};
    char *d = ckpt_pointer_doc("file:///fuzz", &older, a.entries[0].step,
                               a.entries[0].generation, (int)a.n);
    FUZZ_CHECK(d);
    FUZZ_CHECK(ckpt_pointer_parse(d, strlen(d), &b, err, sizeof err) == 0);
    FUZZ_CHECK(b.n == a.n && memcmp(a.entries, b.entries, a.n * sizeof *a.entries) == 0);
    free(d);
    ckpt_pointer_clear(&a);
    ckpt_pointer_clear(&b);
}

static void dir_name(const char *in, size_t len)
{
    int64_t step, gen;
    if (!ckpt_dir_parse(in, len, &step, &gen))
        return;
    char again[64];
    ckpt_dir_name(step, gen, again, sizeof again);
    FUZZ_CHECK(strlen(again) == len && memcmp(again, in, len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    const char *in = (const char *)data;
    manifest(in, size);
    rank_doc(in, size);
    pointer(in, size);
    dir_name(in, size);
    return 0;
}
