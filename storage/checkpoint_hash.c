/* checkpoint_hash.c: the digests that check a checkpoint's shards, one streaming interface over
 * each algorithm a manifest may name: XXH3-128 (libxxhash; every new checkpoint, at memory
 * speed) and SHA-256 (OpenSSL EVP; checkpoints written before XXH3, verified, never written).
 * The table below is the one place that knows the algorithms' names and digest lengths. */
#include "checkpoint_internal.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    size_t hex_len;
} algs[] = {
    [EDL_CKPT_XXH3_128] = {"xxh3-128", 32},
    [EDL_CKPT_SHA256] = {"sha256", 64},
};

const char *ckpt_hash_name(edl_ckpt_hash alg)
{
    return algs[alg].name;
}

size_t ckpt_hash_hex_len(edl_ckpt_hash alg)
{
    return algs[alg].hex_len;
}

bool ckpt_hash_parse(const char *name, edl_ckpt_hash *alg)
{
    for (size_t i = 0; name && i < sizeof algs / sizeof algs[0]; i++)
        if (strcmp(name, algs[i].name) == 0) {
            *alg = (edl_ckpt_hash)i;
            return true;
        }
    return false;
}

int ckpt_hasher_init(ckpt_hasher *h, edl_ckpt_hash alg)
{
    memset(h, 0, sizeof *h);
    h->alg = alg;
    if (alg == EDL_CKPT_XXH3_128) {
        h->xxh = XXH3_createState();
        return h->xxh && XXH3_128bits_reset(h->xxh) == XXH_OK ? 0 : EDL_ENOMEM;
    }
    h->md = EVP_MD_CTX_new();
    return h->md && EVP_DigestInit_ex(h->md, EVP_sha256(), NULL) == 1 ? 0 : EDL_ENOMEM;
}

int ckpt_hasher_update(ckpt_hasher *h, const void *data, size_t len)
{
    if (h->alg == EDL_CKPT_XXH3_128)
        return XXH3_128bits_update(h->xxh, data, len) == XXH_OK ? 0 : EDL_ENOMEM;
    return EVP_DigestUpdate(h->md, data, len) == 1 ? 0 : EDL_ENOMEM;
}

static void to_hex(const unsigned char *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

int ckpt_hasher_final(ckpt_hasher *h, char out[65])
{
    if (h->alg == EDL_CKPT_XXH3_128) {
        XXH128_canonical_t c; /* big-endian bytes: the hex reads the same on every machine */
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(h->xxh));
        to_hex(c.digest, sizeof c.digest, out);
        return 0;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_DigestFinal_ex(h->md, md, &mdlen) != 1 || mdlen != 32)
        return EDL_ENOMEM;
    to_hex(md, mdlen, out);
    return 0;
}

void ckpt_hasher_clear(ckpt_hasher *h)
{
    XXH3_freeState(h->xxh);
    EVP_MD_CTX_free(h->md);
    h->xxh = NULL;
    h->md = NULL;
}
