/* auth.c: the link handshake of the CPU mesh, without I/O. The wire forms of the hello, the
 * challenge, the proof and the ready frame (encoded little-endian byte by byte, parsed from a
 * buffer and its length into a struct, so a fuzzer can call the parsers), and the MACs that
 * bind each frame to the job, the generation, both ranks, both nonces and its direction. */
#include <string.h>

#include "edl/wire.h"
#include "internal.h"

/* hello: magic(4) version(2) pad(2) generation(8) from(4) to(4) size(4) pad(4) token(8)
 * nonce(16) */
void coll_hello_encode(const coll_hello *h, uint8_t out[COLL_HELLO_BYTES])
{
    memset(out, 0, COLL_HELLO_BYTES);
    edl_put32(out, COLL_HELLO_MAGIC);
    edl_put16(out + 4, h->version);
    edl_put64(out + 8, (uint64_t)h->generation);
    edl_put32(out + 16, (uint32_t)h->from);
    edl_put32(out + 20, (uint32_t)h->to);
    edl_put32(out + 24, (uint32_t)h->size);
    edl_put64(out + 32, h->token);
    memcpy(out + 40, h->nonce, COLL_NONCE_BYTES);
}

int coll_hello_parse(const void *buf, size_t len, coll_hello *out, char *why, size_t whylen)
{
    const uint8_t *p = buf;
    if (len >= 4 && edl_get32(p) != COLL_HELLO_MAGIC)
        return edl_errf(why, whylen, EDL_EPROTO, "did not start with an edl hello");
    if (len >= 6 && edl_get16(p + 4) != COLL_PROTO_VERSION)
        return edl_errf(why, whylen, EDL_EPROTO, "speaks edl link protocol version %u, this "
                        "process version %u", edl_get16(p + 4), COLL_PROTO_VERSION);
    if (len < COLL_HELLO_BYTES)
        return 1;
    coll_hello h = {.version = edl_get16(p + 4), .generation = (int64_t)edl_get64(p + 8),
                    .from = (int32_t)edl_get32(p + 16), .to = (int32_t)edl_get32(p + 20),
                    .size = (int32_t)edl_get32(p + 24), .token = edl_get64(p + 32)};
    memcpy(h.nonce, p + 40, COLL_NONCE_BYTES);
    if (h.generation < 0 || h.from < 0 || h.to < 0 || h.size < 1 || h.from >= h.size ||
        h.to >= h.size)
        return edl_errf(why, whylen, EDL_EPROTO, "a hello with impossible numbers (generation "
                        "%lld, from rank %d to rank %d of %d)", (long long)h.generation, h.from,
                        h.to, h.size);
    *out = h;
    return 0;
}

size_t coll_frame_bytes(uint32_t magic)
{
    return 4 + (magic == COLL_CHALLENGE_MAGIC ? COLL_NONCE_BYTES : 0) + EDL_SECRET_MAC_BYTES;
}

void coll_frame_encode(uint32_t magic, const uint8_t *nonce, const uint8_t *mac, uint8_t *out)
{
    edl_put32(out, magic);
    size_t off = 4;
    if (magic == COLL_CHALLENGE_MAGIC) {
        memcpy(out + off, nonce, COLL_NONCE_BYTES);
        off += COLL_NONCE_BYTES;
    }
    memcpy(out + off, mac, EDL_SECRET_MAC_BYTES);
}

int coll_frame_parse(const void *buf, size_t len, uint32_t magic, uint8_t *nonce, uint8_t *mac)
{
    const uint8_t *p = buf;
    if (len >= 4 && edl_get32(p) != magic)
        return EDL_EPROTO;
    if (len < coll_frame_bytes(magic))
        return 1;
    size_t off = 4;
    if (magic == COLL_CHALLENGE_MAGIC) {
        memcpy(nonce, p + off, COLL_NONCE_BYTES);
        off += COLL_NONCE_BYTES;
    }
    memcpy(mac, p + off, EDL_SECRET_MAC_BYTES);
    return 0;
}

/* The MAC input: a domain tag, the frame's kind (its direction), the job (its key prefix,
 * which names the etcd prefix and the job), then the whole transcript of the link. */
int coll_link_mac(const edl_job_secret *s, const char *job, const coll_link *l,
                  enum coll_mac_kind kind, uint8_t out[EDL_SECRET_MAC_BYTES])
{
    uint8_t transcript[COLL_HELLO_BYTES + COLL_NONCE_BYTES];
    coll_hello_encode(&l->h, transcript);
    memcpy(transcript + COLL_HELLO_BYTES, l->nonce_a, COLL_NONCE_BYTES);
    return edl_job_secret_link_mac(s, "edl-coll-link-v2", (uint8_t)kind, job, transcript,
                                   sizeof transcript, out);
}
