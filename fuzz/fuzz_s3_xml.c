/* fuzz_s3_xml.c: feeds every input, as an S3 reply body comes off the network, to what the
 * s3:// store reads in it (storage/s3_xml.c): one ListObjectsV2 page under a prefix
 * (s3_list_page_parse) and the text of the elements it looks up (s3_xml_text: Code, Message,
 * UploadId, IsTruncated, NextContinuationToken). The body is a C string there (s3.c keeps a NUL
 * after it), so it is here. Asserts beyond "no crash": a refusal says why; every key taken is
 * a valid key (edl/storage.h) of at most 512 bytes, no more keys than <Contents> elements; a
 * page that says more follows has a token that fits; the keys and token taken, written back as
 * a page, parse to the same; an element's text is exactly the bytes between its tags when it
 * fits its buffer, and their start when not, and is never text holding markup ('<'). */
#include "fuzz.h"

#include "storage/internal.h"

#define PREFIX "ck/"

static size_t count(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* One page holding keys (below PREFIX) and, when more, the token. */
static char *write_page(char **keys, size_t n, bool more, const char *next)
{
    size_t cap = 256 + strlen(next), off = 0;
    for (size_t i = 0; i < n; i++)
        cap += strlen(keys[i]) + 64;
    char *x = malloc(cap);
    if (!x)
        abort();
    off += (size_t)snprintf(x, cap, "<ListBucketResult><IsTruncated>%s</IsTruncated>",
                            more ? "true" : "false");
    for (size_t i = 0; i < n; i++)
        off += (size_t)snprintf(x + off, cap - off, "<Contents><Key>" PREFIX "%s</Key></Contents>",
                                keys[i]);
    if (more)
        off += (size_t)snprintf(x + off, cap - off, "<NextContinuationToken>%s"
                                "</NextContinuationToken>", next);
    snprintf(x + off, cap - off, "</ListBucketResult>");
    return x;
}

static void free_keys(char **keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
}

static void check_page(const char *xml)
{
    char **keys = NULL, next[1024] = "", why[256] = "";
    size_t n = 0, cap = 0;
    bool more = true;
    int rc = s3_list_page_parse(xml, PREFIX, &keys, &n, &cap, &more, next, sizeof next, why,
                                sizeof why);
    if (rc) {
        FUZZ_CHECK(rc == EDL_EPROTO && why[0]);
        free_keys(keys, n);
        return;
    }
    FUZZ_CHECK(n <= count(xml, "<Contents>"));
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(edl_storage_key_valid(keys[i]) && strlen(keys[i]) <= 512);
    FUZZ_CHECK(!more || (next[0] && strlen(next) < sizeof next));
    char *again = write_page(keys, n, more, next), **k2 = NULL, next2[1024] = "";
    size_t n2 = 0, cap2 = 0;
    bool more2 = false;
    FUZZ_CHECK(s3_list_page_parse(again, PREFIX, &k2, &n2, &cap2, &more2, next2, sizeof next2,
                                  why, sizeof why) == 0);
    FUZZ_CHECK(n2 == n && more2 == more && (!more || strcmp(next, next2) == 0));
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(strcmp(keys[i], k2[i]) == 0);
    free(again);
    free_keys(keys, n);
    free_keys(k2, n2);
}

static void check_text(const char *xml, const char *tag, size_t outlen)
{
    char out[1100], open[64], close[64];
    memset(out, 'x', sizeof out);
    int got = s3_xml_text(xml, tag, out, outlen);
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = strstr(xml, open), *b = a ? strstr(a + strlen(open), close) : NULL;
    size_t n = b ? (size_t)(b - a - strlen(open)) : 0;
    FUZZ_CHECK((got != 0) == (b != NULL && !memchr(a + strlen(open), '<', n)));
    if (!got)
        return;
    a += strlen(open);
    size_t len = strlen(out);
    FUZZ_CHECK(len < outlen);
    FUZZ_CHECK(got == 1 ? len == n || memchr(a, '\0', n) : n >= outlen && len == outlen - 1);
    FUZZ_CHECK(strncmp(out, a, len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_log_setup();
    char *xml = fuzz_cstr(data, size);
    check_page(xml);
    check_text(xml, "Code", 128);
    check_text(xml, "Message", 256);
    check_text(xml, "UploadId", 1100);
    check_text(xml, "IsTruncated", 16);
    check_text(xml, "NextContinuationToken", 1024);
    free(xml);
    return 0;
}
