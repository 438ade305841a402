/* fuzz_distill_wire.c: feeds every input to libedldistill's decoders (distill/wire.c) as a
 * teacher's reply or a student's request comes off the network. The first byte picks the form
 * and the direction: bit 0 binary or JSON, bit 1 reply or request; the rest is the body.
 * Asserts beyond "no crash": a refusal always says why; a tensor taken has a shape inside the
 * limits, encodes back in the same form and decodes to the same floats bit for bit (JSON's
 * "%.9g" round-trips every float), and a binary body taken is exactly its re-encoding. */
#include "fuzz.h"

#include "distill/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    if (size < 1)
        return 0;
    edl_distill_format f = data[0] & 1 ? EDL_DISTILL_BINARY : EDL_DISTILL_JSON;
    bool reply = data[0] & 2;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    char err[256] = "";
    float *x = NULL;
    uint32_t rows = 0, cols = 0;
    int rc = edl_distill_decode(f, reply, body, len, &x, &rows, &cols, err, sizeof err);
    if (rc) {
        FUZZ_CHECK(err[0] != '\0' && x == NULL);
        FUZZ_CHECK(rc == EDL_EPROTO || rc == EDL_ETOOBIG);
        return 0;
    }
    FUZZ_CHECK(rows >= 1 && cols >= 1 && rows <= EDL_DISTILL_MAX_ROWS &&
               cols <= EDL_DISTILL_MAX_COLS);
    char *again;
    size_t alen;
    FUZZ_CHECK(edl_distill_encode(f, reply, x, rows, cols, &again, &alen) == 0);
    if (f == EDL_DISTILL_BINARY)
        FUZZ_CHECK(alen == len && memcmp(again, body, len) == 0);
    float *y = NULL;
    uint32_t r2, c2;
    FUZZ_CHECK(edl_distill_decode(f, reply, again, alen, &y, &r2, &c2, err, sizeof err) == 0);
    FUZZ_CHECK(r2 == rows && c2 == cols);
    FUZZ_CHECK(memcmp(x, y, (size_t)rows * cols * sizeof *x) == 0 || f == EDL_DISTILL_JSON);
    for (size_t i = 0; f == EDL_DISTILL_JSON && i < (size_t)rows * cols; i++)
        FUZZ_CHECK(x[i] == y[i]); /* -0 and 0 compare equal: "%.9g" keeps the sign anyway */
    free(again);
    free(x);
    free(y);
    return 0;
}
