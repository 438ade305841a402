/* fuzz_manifest.c: feeds every input as a manifest file to `edl run -f`'s readers: YAML into
 * cJSON with lines (core/yaml.c), then every document through the unknown-field check
 * (job/trainingjob_fields.c), the TrainingJob reader and the cluster-only report
 * (job/trainingjob.c). Asserts beyond "no crash": a refused file leaves no
 * result and a message naming it; a refused TrainingJob leaves its output cleared and names a
 * field whose line is known; an accepted one has a command and a spec that validates. */
#include "fuzz.h"

#include "edl/trainingjob.h"
#include "edl/yaml.h"

static void count_field(void *arg, const char *field)
{
    FUZZ_CHECK(field && *field);
    (*(int *)arg)++;
}

static void one_doc(const edl_yaml *y, size_t i)
{
    edl_trainingjob tj, zero = {0};
    char field[256], err[512];
    if (edl_trainingjob_unknown_field(edl_yaml_doc(y, i), field, sizeof field, err,
                                      sizeof err) != 0) /* names a field that is there */
        FUZZ_CHECK(*field && strstr(err, field) && edl_yaml_line(y, i, field) > 0);
    int rc = edl_trainingjob_parse(edl_yaml_doc(y, i), &tj, field, sizeof field, err,
                                   sizeof err);
    if (rc) {
        FUZZ_CHECK(memcmp(&tj, &zero, sizeof tj) == 0);
        FUZZ_CHECK(strlen(err) > 0);
        FUZZ_CHECK(edl_yaml_line(y, i, field) > 0);
    } else {
        FUZZ_CHECK(tj.name && tj.ns && tj.pod_template);
        FUZZ_CHECK(tj.n_command > 0 && tj.command[0] && !tj.command[tj.n_command]);
        FUZZ_CHECK(edl_spec_validate(&tj.spec, err, sizeof err) == 0);
        bool ps = tj.spec.ps_max > 0; /* spec.ps: its template and command, else none */
        FUZZ_CHECK(ps == (tj.ps_template != NULL) && ps == (tj.ps_command != NULL));
        FUZZ_CHECK(!ps || (tj.n_ps_command > 0 && !tj.ps_command[tj.n_ps_command]));
        int n = 0;
        edl_trainingjob_cluster_only(edl_yaml_doc(y, i), count_field, &n);
    }
    edl_trainingjob_clear(&tj);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    edl_yaml *y = NULL;
    char err[512] = "";
    int rc = edl_yaml_load("m.yaml", (const char *)data, size, &y, err, sizeof err);
    if (rc) {
        FUZZ_CHECK(!y && strncmp(err, "m.yaml", 6) == 0);
        return 0;
    }
    FUZZ_CHECK(edl_yaml_count(y) > 0);
    for (size_t i = 0; i < edl_yaml_count(y) && i < 16; i++)
        one_doc(y, i);
    edl_yaml_free(y);
    return 0;
}
