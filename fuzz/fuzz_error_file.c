/* fuzz_error_file.c: feeds every input as the contents of TORCHELASTIC_ERROR_FILE, which a
 * failing trainer writes and the agent reads back into the pod's status (agent/error_file.c,
 * agent_error_message), into a roomy and a tight buffer. Asserts beyond "no crash": the
 * message is one line of printable bytes that fits its buffer, and it is found (0) exactly
 * when it is not empty. */
#include "fuzz.h"

#include "agent.h"

static void one(const char *buf, size_t n, size_t len)
{
    char out[512];
    memset(out, 'X', sizeof out);
    bool own = true;
    int rc = agent_error_message(buf, n, out, len, &own);
    FUZZ_CHECK(!own || rc == 0); /* a mark only with a message */
    size_t got = strnlen(out, len);
    FUZZ_CHECK(got < len); /* NUL-terminated within its buffer */
    for (size_t i = 0; i < got; i++)
        FUZZ_CHECK((unsigned char)out[i] >= 0x20 && out[i] != 0x7f);
    FUZZ_CHECK((rc == 0) == (got > 0));
    FUZZ_CHECK(rc == 0 || rc == EDL_ENOTFOUND);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    char *buf = fuzz_cstr(data, size); /* as the reader leaves it: NUL after what it read */
    one(buf, size, 512);
    one(buf, size, 8);
    free(buf);
    return 0;
}
