/* bytes.c: the growable byte buffer of edl/common.h, for bytes that arrive in pieces. It grows
 * by doubling as the bytes come, never from a size someone announced, and never past its bound.
 * Also the splitting of a stream into lines, and the bounded reader of a whole small file
 * (manifests, certificates). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int edl_lines_feed(edl_bytebuf *held, const char *p, size_t n, edl_line_fn on_line, void *arg)
{
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n')
            continue;
        const char *line = p + start;
        size_t len = i - start;
        if (held->len) { /* complete the line held from the last piece */
            int rc = edl_bytebuf_append(held, line, len);
            if (rc)
                return rc;
            line = held->data;
            len = held->len;
        }
        bool ok = len == 0 || on_line(arg, line, len);
        held->len = 0;
        start = i + 1;
        if (!ok)
            return EDL_ECLOSED;
    }
    return start < n ? edl_bytebuf_append(held, p + start, n - start) : 0;
}

int edl_file_read(const char *path, size_t max, char **out, size_t *len, char *err,
                  size_t errlen)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return edl_errf(err, errlen, EDL_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode) || (size_t)st.st_size > max) {
        close(fd);
        return S_ISREG(st.st_mode)
                   ? edl_errf(err, errlen, EDL_ETOOBIG, "%s: %lld bytes; at most %zu are read",
                              path, (long long)st.st_size, max)
                   : edl_errf(err, errlen, EDL_EIO, "%s: not a regular file", path);
    }
    /* read up to one byte past the limit: a file that grew since fstat is still refused */
    char *buf = malloc(max + 1);
    size_t got = 0;
    ssize_t n = 0;
    while (buf && got <= max &&
           ((n = read(fd, buf + got, max + 1 - got)) > 0 || (n < 0 && errno == EINTR)))
        got += n > 0 ? (size_t)n : 0;
    int e = errno;
    close(fd);
    int rc = 0;
    if (!buf)
        rc = edl_errf(err, errlen, EDL_ENOMEM, "%s: out of memory", path);
    else if (n < 0)
        rc = edl_errf(err, errlen, EDL_EIO, "%s: %s", path, strerror(e));
    else if (got > max)
        rc = edl_errf(err, errlen, EDL_ETOOBIG, "%s: more than %zu bytes", path, max);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return 0;
}
