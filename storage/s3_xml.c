/* s3_xml.c: the few things s3.c reads in S3's XML replies, as pure functions of the reply's
 * text (fuzzed by fuzz/fuzz_s3_xml.c): the text of an element (an error's Code and Message, a
 * multipart upload's UploadId) and one page of a ListObjectsV2 listing. S3's replies are
 * flat and their elements never nest in themselves, so a search for the tags reads them;
 * anything that does not fit what we asked for is refused, never guessed. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#define KEY_MAX 512 /* bytes of a key below the store's prefix (edl/storage.h) */

int s3_xml_text(const char *xml, const char *tag, char *out, size_t outlen)
{
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = xml ? strstr(xml, open) : NULL;
    const char *b = a ? strstr(a + strlen(open), close) : NULL;
    if (!b || outlen == 0)
        return 0;
    a += strlen(open);
    size_t n = (size_t)(b - a), cut = n < outlen ? n : outlen - 1;
    if (memchr(a, '<', n))
        return 0; /* markup inside: not the text of one element (fuzz_s3_xml found a token
                     that swallowed the elements after it) */
    memcpy(out, a, cut);
    out[cut] = '\0';
    return cut == n ? 1 : -1;
}

/* The key of one <Contents> element (from p, before end) below prefix, into key; 1 taken, 0
 * not ours (outside the prefix, or not a key of ours), or EDL_EPROTO. */
static int contents_key(const char *p, const char *end, const char *prefix,
                        char key[KEY_MAX + 8], char *why, size_t whylen)
{
    size_t plen = strlen(prefix);
    const char *k = strstr(p, "<Key>");
    if (!k || k > end)
        return edl_errf(why, whylen, EDL_EPROTO, "a <Contents> without a <Key>");
    k += 5;
    const char *ke = strstr(k, "</Key>");
    if (!ke || ke > end)
        return edl_errf(why, whylen, EDL_EPROTO, "an unterminated <Key>");
    size_t klen = (size_t)(ke - k);
    if (klen <= plen || klen - plen > KEY_MAX || strncmp(k, prefix, plen) != 0)
        return 0;
    memcpy(key, k + plen, klen - plen);
    key[klen - plen] = '\0';
    return edl_storage_key_valid(key) ? 1 : 0; /* foreign objects with other names */
}

int s3_list_page_parse(const char *xml, const char *prefix, char ***keys, size_t *n,
                       size_t *cap, bool *more, char *next, size_t nextlen, char *why,
                       size_t whylen)
{
    *more = false;
    if (!xml || !strstr(xml, "<ListBucketResult"))
        return edl_errf(why, whylen, EDL_EPROTO, "the reply is not a ListBucketResult");
    for (const char *p = strstr(xml, "<Contents>"); p; p = strstr(p, "<Contents>")) {
        p += 10;
        const char *end = strstr(p, "</Contents>");
        char key[KEY_MAX + 8];
        int rc = end ? contents_key(p, end, prefix, key, why, whylen)
                     : edl_errf(why, whylen, EDL_EPROTO, "an unterminated <Contents>");
        if (rc < 0 || (rc == 1 && (rc = storage_list_add(keys, n, cap, key, strlen(key))) != 0))
            return rc;
        p = end;
    }
    char trunc[16];
    *more = s3_xml_text(xml, "IsTruncated", trunc, sizeof trunc) == 1 &&
            strcmp(trunc, "true") == 0;
    int got = *more ? s3_xml_text(xml, "NextContinuationToken", next, nextlen) : 1;
    if (got == 0 || (*more && !next[0]))
        return edl_errf(why, whylen, EDL_EPROTO, "a truncated list without a continuation "
                        "token");
    if (got < 0)
        return edl_errf(why, whylen, EDL_EPROTO, "a continuation token over %zu bytes",
                        nextlen - 1);
    return 0;
}
