/* internal.h (storage/): what storage.c shares with its back ends (file.c, s3.c).
 *
 * storage.c parses the URI, checks keys and arguments, and dispatches through a small table of
 * functions; each back end sees only validated keys and a byte source that hides whether the
 * caller gave a buffer or a stream. */
#ifndef EDL_STORAGE_INTERNAL_H
#define EDL_STORAGE_INTERNAL_H

#include "edl/storage.h"

#include <stdarg.h>

/* Bytes to put: a whole buffer (read == NULL) or a caller's stream. */
typedef struct storage_source {
    const char *buf;
    size_t len;
    edl_storage_read_fn read;
    void *arg;
    edl_storage_observe_fn observe; /* buffers only (edl_storage_put_observed); may be NULL */
    void *observe_arg;
} storage_source;

/* Show len bytes at p to the source's observer (if any). A back end calls it once for every
 * byte of a buffer source, in order, just before writing or first sending it. */
void storage_source_observe(const storage_source *src, const void *p, size_t len);

/* Fill dst with up to cap bytes from a stream source, looping until cap bytes or the end.
 * Returns the count or a negative EDL_E* code (the source's own, or EDL_EIO). */
ssize_t storage_source_fill(edl_storage *s, storage_source *src, char *dst, size_t cap);

typedef struct storage_backend {
    const char *scheme;
    int (*open)(edl_storage *s, const edl_storage_config *cfg, const char *rest);
    void (*close)(edl_storage *s);
    int (*put)(edl_storage *s, const char *key, storage_source *src);
    int (*get_stream)(edl_storage *s, const char *key, edl_storage_write_fn write, void *arg,
                      uint64_t *size_out);
    /* May be NULL (storage.c then copies from get_stream). */
    int (*get_into)(edl_storage *s, const char *key, char *dst, size_t cap,
                    edl_storage_observe_fn observe, void *arg, uint64_t *size_out);
    int (*stat_key)(edl_storage *s, const char *key, edl_storage_stat *st);
    /* Unsorted: storage.c sorts. */
    int (*list)(edl_storage *s, const char *prefix, char ***keys, size_t *n, size_t *cap);
    int (*del)(edl_storage *s, const char *key);
} storage_backend;

struct edl_storage {
    const storage_backend *be;
    char *uri;
    void *impl;          /* the back end's own state */
    unsigned rand_state; /* jitter and temporary names: per handle, no global state */
    char errmsg[768];
};

extern const storage_backend storage_file_backend;
extern const storage_backend storage_s3_backend;

/* Record why the call failed and return code (so `return storage_fail(s, rc, ...)` reads). */
int storage_fail(edl_storage *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Append a key to a growing list (for back ends' list). */
int storage_list_add(char ***keys, size_t *n, size_t *cap, const char *key, size_t len);
unsigned storage_rand(edl_storage *s);

/* ---- S3's XML replies (s3_xml.c): pure, fuzzed ---------------------------------------- */

/* The text of the first <tag>...</tag> in xml (NUL-terminated) into out: 1, or 0 when there is
 * none or it holds markup ('<': not one element's text), or -1 when it does not fit (out holds
 * its start). */
int s3_xml_text(const char *xml, const char *tag, char *out, size_t outlen);
/* One ListObjectsV2 page: the <Key>s below prefix, the prefix cut off, that are valid keys
 * (storage_list_add into keys; other objects are skipped), whether more pages follow (*more)
 * and then their token (next). 0; EDL_EPROTO (why) for a reply that is not a listing, a
 * <Contents> without a whole <Key>, a truncated page without a token or with one over
 * nextlen - 1 bytes; EDL_ENOMEM. */
int s3_list_page_parse(const char *xml, const char *prefix, char ***keys, size_t *n,
                       size_t *cap, bool *more, char *next, size_t nextlen, char *why,
                       size_t whylen);

#endif
