/* fuzz_coll_hello.c: feeds every input as the first bytes of a collective link, as they
 * arrive (every prefix in turn), to the acceptor's hello parser and to the frame parser of
 * each handshake frame (challenge, proof, ready: collective/auth.c). Asserts beyond "no
 * crash": a parser's answer never goes from "refused" back to "more bytes" or "taken" as bytes
 * arrive; a hello is taken only once whole and only with possible numbers, and its encoding
 * parses back the same; a frame taken is the input's own bytes, encoded back exactly. */
#include "fuzz.h"

#include "collective/internal.h"

static void hello(const uint8_t *data, size_t size)
{
    int last = 1;
    for (size_t len = 0; len <= size && len <= COLL_HELLO_BYTES + 1; len++) {
        coll_hello h, back;
        char why[256] = "";
        int rc = coll_hello_parse(data, len, &h, why, sizeof why);
        FUZZ_CHECK(rc == 0 || rc == 1 || (rc == EDL_EPROTO && why[0]));
        FUZZ_CHECK(last != EDL_EPROTO || rc == EDL_EPROTO);
        FUZZ_CHECK(rc != 1 || len < COLL_HELLO_BYTES);
        last = rc;
        if (rc != 0)
            continue;
        FUZZ_CHECK(len >= COLL_HELLO_BYTES && h.generation >= 0 && h.size >= 1 &&
                   h.from >= 0 && h.from < h.size && h.to >= 0 && h.to < h.size);
        uint8_t enc[COLL_HELLO_BYTES];
        coll_hello_encode(&h, enc);
        FUZZ_CHECK(coll_hello_parse(enc, sizeof enc, &back, why, sizeof why) == 0);
        FUZZ_CHECK(back.version == h.version && back.generation == h.generation &&
                   back.from == h.from && back.to == h.to && back.size == h.size &&
                   back.token == h.token && memcmp(back.nonce, h.nonce, sizeof h.nonce) == 0);
    }
}

static void frame(const uint8_t *data, size_t size, uint32_t magic)
{
    size_t whole = coll_frame_bytes(magic);
    int last = 1;
    for (size_t len = 0; len <= size && len <= whole + 1; len++) {
        uint8_t nonce[COLL_NONCE_BYTES], mac[EDL_SECRET_MAC_BYTES], enc[64];
        int rc = coll_frame_parse(data, len, magic, nonce, mac);
        FUZZ_CHECK(rc == 0 || rc == 1 || rc == EDL_EPROTO);
        FUZZ_CHECK(last != EDL_EPROTO || rc == EDL_EPROTO);
        FUZZ_CHECK((rc == 1) == (len < whole && last != EDL_EPROTO && rc != EDL_EPROTO));
        last = rc;
        if (rc != 0)
            continue;
        FUZZ_CHECK(whole <= sizeof enc);
        coll_frame_encode(magic, nonce, mac, enc);
        FUZZ_CHECK(memcmp(enc, data, whole) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    hello(data, size);
    frame(data, size, COLL_CHALLENGE_MAGIC);
    frame(data, size, COLL_PROOF_MAGIC);
    frame(data, size, COLL_READY_MAGIC);
    return 0;
}
