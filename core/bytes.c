/* bytes.c: the growable byte buffer of edl/common.h, for bytes that arrive in pieces. It grows
 * by doubling as the bytes come, never from a size someone announced, and never past its bound. */
#include <stdlib.h>
#include <string.h>

#include "edl/common.h"

int edl_bytebuf_append(edl_bytebuf *b, const void *p, size_t n)
{
    if (b->max && n > b->max - (b->len < b->max ? b->len : b->max)) {
        b->overflow = true;
        return EDL_ETOOBIG;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        if (b->max && cap > b->max + 1)
            cap = b->max + 1;
        char *d = realloc(b->data, cap);
        if (!d)
            return EDL_ENOMEM;
        b->data = d;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

void edl_bytebuf_clear(edl_bytebuf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->overflow = false;
}

size_t edl_bytebuf_curl_write(char *ptr, size_t size, size_t nmemb, void *bytebuf)
{
    return edl_bytebuf_append(bytebuf, ptr, size * nmemb) == 0 ? size * nmemb : 0;
}
