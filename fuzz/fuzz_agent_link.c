/* fuzz_agent_link.c: feeds every input to both ends of the agent <-> trainer protocol: as a
 * control line to the trainer's edl_assignment_parse, as one progress line to
 * edl_progress_line_parse (job/agent_link.c), and as bytes of the progress pipe to the agent's
 * trainer_progress_feed (agent/trainer_proc.c), whole and in chunks. Asserts beyond "no
 * crash": a control line that parses is one JSON object and nothing more, and its assignment
 * encodes to a line that parses to the same; a progress line that parses is written the way
 * the trainer's side writes it and parses back the same; what the agent reads from the pipe
 * (step, wait) does not depend on how the bytes were chunked, and the partial line stays
 * within its buffer. */
#include "fuzz.h"

#include "agent.h"
#include "edl/agent_link.h"

static void control_line(const char *in, size_t len)
{
    edl_assignment a, b;
    if (edl_assignment_parse(in, len, &a) != 0)
        return;
    FUZZ_CHECK(fuzz_one_json((const uint8_t *)in, len));
    FUZZ_CHECK(a.generation >= 1 && (a.leave || (a.rank >= 0 && a.rank < a.world_size)));
    char *line = edl_assignment_encode(&a);
    FUZZ_CHECK(line);
    size_t n = strlen(line);
    FUZZ_CHECK(n && line[n - 1] == '\n' && !memchr(line, '\n', n - 1));
    FUZZ_CHECK(edl_assignment_parse(line, n - 1, &b) == 0);
    FUZZ_CHECK(a.generation == b.generation && a.leave == b.leave && a.rank == b.rank &&
               a.world_size == b.world_size && a.master_port == b.master_port &&
               strcmp(a.master_addr, b.master_addr) == 0);
    free(line);
}

/* As edl_agent_link_report_step/_blocked/_unblocked/_ready/_inprocess/_checkpoint/_distill/
 * _total write them. */
static void progress_line(const char *in, size_t len)
{
    edl_progress_line a, b;
    if (edl_progress_line_parse(in, len, &a) != 0)
        return;
    char buf[EDL_PROGRESS_WHAT_MAX + 64];
    int n = a.kind == EDL_PROGRESS_STEP ? snprintf(buf, sizeof buf, "step %lld", (long long)a.value)
            : a.kind == EDL_PROGRESS_BLOCKED
                ? snprintf(buf, sizeof buf, "blocked %lld %s", (long long)a.value, a.what)
                : a.kind == EDL_PROGRESS_READY ? snprintf(buf, sizeof buf, "ready")
                : a.kind == EDL_PROGRESS_GRACEFUL ? snprintf(buf, sizeof buf, "graceful")
                : a.kind == EDL_PROGRESS_INPROCESS ? snprintf(buf, sizeof buf, "inprocess")
                : a.kind == EDL_PROGRESS_CHECKPOINT_SAVE || a.kind == EDL_PROGRESS_CHECKPOINT_LOAD
                ? snprintf(buf, sizeof buf, "checkpoint %s %lld %lld", a.kind ==
                           EDL_PROGRESS_CHECKPOINT_LOAD ? "load" : "save", (long long)a.value,
                           (long long)a.value2)
                : a.kind == EDL_PROGRESS_TOTAL
                ? snprintf(buf, sizeof buf, "total %lld", (long long)a.value)
                : a.kind == EDL_PROGRESS_DISTILL
                ? snprintf(buf, sizeof buf, "distill %lld %lld", (long long)a.value,
                           (long long)a.value2)
                : snprintf(buf, sizeof buf, "unblocked");
    FUZZ_CHECK(n > 0 && (size_t)n < sizeof buf);
    FUZZ_CHECK(a.value >= 0 && a.value2 >= 0 && strlen(a.what) <= EDL_PROGRESS_WHAT_MAX);
    FUZZ_CHECK(edl_progress_line_parse(buf, (size_t)n, &b) == 0);
    FUZZ_CHECK(a.kind == b.kind && a.value == b.value && a.value2 == b.value2 &&
               strcmp(a.what, b.what) == 0);
}

typedef struct { int64_t step; bool blocked; char what[EDL_PROGRESS_WHAT_MAX + 1]; } seen;

static seen pipe_bytes(const char *in, size_t len, size_t chunk)
{
    trainer_proc t;
    trainer_init(&t);
    for (size_t off = 0; off < len; off += chunk) {
        trainer_progress_feed(&t, in + off, len - off < chunk ? len - off : chunk);
        FUZZ_CHECK(t.line_len < sizeof t.line);
    }
    FUZZ_CHECK(t.step >= -1 && t.blocked_since_ms >= 0);
    seen s = {t.step, t.blocked_since_ms != 0, ""};
    if (s.blocked)
        memcpy(s.what, t.blocked_what, sizeof s.what);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    const char *in = (const char *)data;
    control_line(in, size);
    progress_line(in, size);
    seen whole = pipe_bytes(in, size, size ? size : 1);
    size_t chunks[] = {1, 7};
    for (int i = 0; i < 2; i++) {
        seen s = pipe_bytes(in, size, chunks[i]);
        FUZZ_CHECK(s.step == whole.step && s.blocked == whole.blocked &&
                   strcmp(s.what, whole.what) == 0);
    }
    return 0;
}
