/* fuzz_job_docs.c: feeds every input to the four job documents' parsers (spec, pod, trainer
 * status, generation: job/spec.c, pod.c, generation.c, through core/json.c). Asserts beyond
 * "no crash": a document that parses is one JSON object with nothing after it, and prints
 * JSON that parses again and prints the same; a spec that parses also validates as it did. */
#include "fuzz.h"

#include "edl/job.h"

static bool spec(const char *in, size_t len)
{
    edl_job_spec a, b;
    char err[256];
    edl_spec_init(&a);
    edl_spec_init(&b);
    bool ok = edl_spec_parse(in, len, &a, err, sizeof err) == 0;
    if (ok) {
        char *j1 = edl_spec_to_json(&a);
        FUZZ_CHECK(j1);
        FUZZ_CHECK(edl_spec_parse(j1, strlen(j1), &b, err, sizeof err) == 0);
        char *j2 = edl_spec_to_json(&b);
        FUZZ_CHECK(j2 && strcmp(j1, j2) == 0);
        FUZZ_CHECK((edl_spec_validate(&a, err, sizeof err) == 0) ==
                   (edl_spec_validate(&b, err, sizeof err) == 0));
        free(j1);
        free(j2);
    }
    edl_spec_clear(&a);
    edl_spec_clear(&b);
    return ok;
}

static bool pod(const char *in, size_t len)
{
    edl_pod a = {0}, b = {0};
    char err[256];
    bool ok = edl_pod_parse(in, len, &a, err, sizeof err) == 0;
    if (ok) {
        char *j1 = edl_pod_to_json(&a);
        FUZZ_CHECK(j1);
        FUZZ_CHECK(edl_pod_parse(j1, strlen(j1), &b, err, sizeof err) == 0);
        char *j2 = edl_pod_to_json(&b);
        FUZZ_CHECK(j2 && strcmp(j1, j2) == 0);
        free(j1);
        free(j2);
    }
    edl_pod_clear(&a);
    edl_pod_clear(&b);
    return ok;
}

static bool status(const char *in, size_t len)
{
    edl_pod_status a = {0}, b = {0};
    char err[256];
    bool ok = edl_pod_status_parse(in, len, &a, err, sizeof err) == 0;
    if (ok) {
        char *j1 = edl_pod_status_to_json(&a);
        FUZZ_CHECK(j1);
        FUZZ_CHECK(edl_pod_status_parse(j1, strlen(j1), &b, err, sizeof err) == 0);
        FUZZ_CHECK(a.generation == b.generation && a.state == b.state &&
                   a.exit_code == b.exit_code && a.signal == b.signal && a.pid == b.pid &&
                   a.step == b.step && a.restarts == b.restarts &&
                   a.total_steps == b.total_steps);
        free(j1);
    }
    return ok;
}

static bool generation(const char *in, size_t len)
{
    edl_generation a = {0}, b = {0};
    char err[256];
    bool ok = edl_generation_parse(in, len, &a, err, sizeof err) == 0;
    if (ok) {
        char *j1 = edl_generation_to_json(&a);
        FUZZ_CHECK(j1);
        FUZZ_CHECK(edl_generation_parse(j1, strlen(j1), &b, err, sizeof err) == 0);
        char *j2 = edl_generation_to_json(&b);
        FUZZ_CHECK(j2 && strcmp(j1, j2) == 0);
        free(j1);
        free(j2);
    }
    edl_generation_clear(&a);
    edl_generation_clear(&b);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    const char *in = (const char *)data;
    bool any = spec(in, size);
    any |= pod(in, size);
    any |= status(in, size);
    any |= generation(in, size);
    FUZZ_CHECK(!any || fuzz_one_json(data, size));
    return 0;
}
