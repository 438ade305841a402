/* fuzz_job_key.c: feeds every input as an etcd key to edl_job_key_parse (job/keys.c) for the
 * job "job-1" under /edl/v1. Asserts beyond "no crash": what the parser recognises is a key
 * that the builders of the same kind spell byte for byte the same (spec, pods/<pod>,
 * status/<pod>, gen/<n>/<name>, ...), and edl_job_key_is_gen agrees with it. */
#include "fuzz.h"

#include "edl/job.h"

static edl_job_keys keys;

/* The name of info as a C string, or NULL when it holds a NUL (no builder takes that). */
static char *name_of(const edl_job_key_info *info)
{
    if (memchr(info->name, '\0', info->name_len))
        return NULL;
    return strndup(info->name, info->name_len);
}

static void check_built(const char *key, size_t len, char *built)
{
    FUZZ_CHECK(built);
    FUZZ_CHECK(strlen(built) == len && memcmp(built, key, len) == 0);
    free(built);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    if (!keys.job && edl_job_keys_init(&keys, "/edl/v1", "job-1") != 0)
        abort();
    const char *key = (const char *)data;
    edl_job_key_info info;
    edl_job_key_kind kind = edl_job_key_parse(&keys, key, size, &info);
    FUZZ_CHECK(kind == info.kind);
    const char *fixed = kind == EDL_KEY_SPEC         ? keys.spec
                        : kind == EDL_KEY_LEADER     ? keys.leader
                        : kind == EDL_KEY_GENERATION ? keys.generation
                        : kind == EDL_KEY_CHECKPOINT ? keys.checkpoint
                                                     : NULL;
    if (fixed)
        check_built(key, size, strdup(fixed));
    if (kind == EDL_KEY_POD || kind == EDL_KEY_STATUS || kind == EDL_KEY_GEN) {
        FUZZ_CHECK(info.name >= key && info.name + info.name_len == key + size);
        char *name = name_of(&info);
        if (name && kind == EDL_KEY_POD)
            check_built(key, size, edl_job_key_pod(&keys, name));
        if (name && kind == EDL_KEY_STATUS)
            check_built(key, size, edl_job_key_status(&keys, name));
        if (name && kind == EDL_KEY_GEN) {
            FUZZ_CHECK(info.gen >= 0 && info.gen <= EDL_GENERATION_MAX);
            FUZZ_CHECK(edl_job_key_is_gen(&info, info.gen, name));
            check_built(key, size, edl_job_key_gen(&keys, info.gen, name));
        }
        free(name);
    }
    return 0;
}
