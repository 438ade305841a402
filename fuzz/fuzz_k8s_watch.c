/* fuzz_k8s_watch.c: feeds every input as a Kubernetes watch stream to the informer's reading of
 * it (k8s/informer.c): split into lines at '\n' as the stream is, empty lines skipped, each to
 * k8s_watch_line_parse, and each event's object trimmed to the fields the operator keeps
 * (k8s_trim). Asserts beyond "no crash": a refusal says why, and a line taken is a JSON object
 * holding a "type" string and an "object" object; an event is ADDED, MODIFIED or
 * DELETED of an object with a name, its key that of k8s_object_key ("ns/name" or "name"); the
 * trimmed object keeps the key and the resourceVersion; the object written and read back gives
 * the same key. */
#include "fuzz.h"

#include "k8s/internal.h"

static const char *const keep[] = {"metadata.name", "metadata.namespace",
                                   "metadata.resourceVersion", "metadata.labels", "status.phase",
                                   NULL};

static void check_event(const k8s_watch_line *w)
{
    char key[512], again[512];
    FUZZ_CHECK(w->type == EDL_K8S_ADDED || w->type == EDL_K8S_MODIFIED ||
               w->type == EDL_K8S_DELETED);
    FUZZ_CHECK(w->key[0] && k8s_object_key(w->obj, key, sizeof key) && !strcmp(key, w->key));
    cJSON *t = k8s_trim(w->obj, keep);
    FUZZ_CHECK(t && k8s_object_key(t, again, sizeof again) && !strcmp(again, w->key));
    FUZZ_CHECK(fuzz_streq(edl_k8s_str(t, "metadata.resourceVersion"),
                          edl_k8s_str(w->obj, "metadata.resourceVersion")));
    char *text = cJSON_PrintUnformatted(w->obj);
    cJSON *back = text ? cJSON_Parse(text) : NULL;
    FUZZ_CHECK(back && k8s_object_key(back, again, sizeof again) && !strcmp(again, w->key));
    cJSON_Delete(back);
    free(text);
    cJSON_Delete(t);
}

static void check_line(const char *line, size_t len)
{
    k8s_watch_line w;
    k8s_watch_kind k = k8s_watch_line_parse(line, len, &w);
    FUZZ_CHECK(k == w.kind);
    bool shaped = cJSON_IsObject(w.root) && cJSON_IsString(
                      cJSON_GetObjectItemCaseSensitive(w.root, "type")) &&
                  cJSON_IsObject(w.obj);
    if (k == K8S_W_BAD)
        FUZZ_CHECK(w.why && w.why[0]);
    else
        FUZZ_CHECK(shaped && w.obj && !w.why);
    if (k == K8S_W_EVENT)
        check_event(&w);
    k8s_watch_line_clear(&w);
    FUZZ_CHECK(!w.root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    const char *p = (const char *)data;
    for (size_t start = 0, i = 0; i <= size; i++) {
        if (i < size && p[i] != '\n')
            continue;
        if (i < size && i > start) /* a last line without '\n' waits for more: not read */
            check_line(p + start, i - start);
        start = i + 1;
    }
    return 0;
}
