/* fuzz_etcd_watch.c: feeds every input as a piece of the watch stream: split at newlines as
 * the watch thread splits it (etcd/watch.c on_stream), each line to the message decoder
 * watch_msg_parse, with and without previous key-values. Asserts beyond "no crash": a message
 * either fails whole or gives events that each carry a positive revision equal to their
 * key-value's mod_revision, with previous key-values only when asked for; a cancellation
 * always has a reason to read (maybe empty). */
#include "fuzz.h"

#include "etcd/internal.h"

static void one(const char *line, size_t len, bool want_prev)
{
    watch_msg m;
    const char *why = NULL;
    int rc = watch_msg_parse(line, len, want_prev, &m, &why);
    if (rc) {
        FUZZ_CHECK(why && rc < 0 && m.n_events == 0);
    } else if (m.canceled) {
        FUZZ_CHECK(m.cancel_reason && m.n_events == 0);
    } else {
        for (size_t i = 0; i < m.n_events; i++) {
            const edl_watch_event *ev = m.events[i];
            FUZZ_CHECK(ev->revision > 0 && ev->revision == ev->kv.mod_revision);
            FUZZ_CHECK(ev->type == EDL_WATCH_PUT || ev->type == EDL_WATCH_DELETE);
            FUZZ_CHECK(want_prev || !ev->prev_kv);
        }
    }
    watch_msg_clear(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    const char *s = (const char *)data, *end = s + size;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        size_t len = (size_t)((nl ? nl : end) - s);
        if (len) {
            one(s, len, false);
            one(s, len, true);
        }
        s += len + 1;
    }
    return 0;
}
