/* fuzz_agent_link.c: feeds every input to both ends of the agent <-> trainer protocol: as a
 * control line to the trainer's edl_assignment_parse (job/agent_link.c), and as bytes of the
 * progress pipe to the agent's trainer_progress_feed (agent/trainer_proc.c), whole and in
 * chunks. Asserts beyond "no crash": a control line that parses is one JSON object and
 * nothing more, and its assignment encodes to a line that parses to the same assignment; the
 * step read does not depend on how the bytes were chunked, and the partial line stays within
 * its buffer. */
#include "fuzz.h"

#include "agent.h"
#include "edl/agent_link.h"

static void control_line(const char *in, size_t len)
{
    edl_assignment a, b;
    if (edl_assignment_parse(in, len, &a) != 0)
        return;
    FUZZ_CHECK(fuzz_one_json((const uint8_t *)in, len));
    FUZZ_CHECK(a.generation >= 1 && a.rank >= 0 && a.rank < a.world_size);
    char *line = edl_assignment_encode(&a);
    FUZZ_CHECK(line);
    size_t n = strlen(line);
    FUZZ_CHECK(n && line[n - 1] == '\n' && !memchr(line, '\n', n - 1));
    FUZZ_CHECK(edl_assignment_parse(line, n - 1, &b) == 0);
    FUZZ_CHECK(a.generation == b.generation && a.rank == b.rank &&
               a.world_size == b.world_size && a.master_port == b.master_port &&
               strcmp(a.master_addr, b.master_addr) == 0);
    free(line);
}

static int64_t progress(const char *in, size_t len, size_t chunk)
{
    trainer_proc t;
    trainer_init(&t);
    for (size_t off = 0; off < len; off += chunk) {
        trainer_progress_feed(&t, in + off, len - off < chunk ? len - off : chunk);
        FUZZ_CHECK(t.line_len < sizeof t.line);
    }
    FUZZ_CHECK(t.step >= -1);
    return t.step;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    const char *in = (const char *)data;
    control_line(in, size);
    int64_t whole = progress(in, size, size ? size : 1);
    FUZZ_CHECK(progress(in, size, 1) == whole);
    FUZZ_CHECK(progress(in, size, 7) == whole);
    return 0;
}
