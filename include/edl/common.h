/* edl/common.h: error codes, byte buffers and other types shared by every edl library. */
#ifndef EDL_COMMON_H
#define EDL_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every edl call returns 0 on success or one of these negative codes. */
enum {
    EDL_OK = 0,
    EDL_EINVAL = -1,      /* invalid argument from the caller */
    EDL_ENOMEM = -2,      /* out of memory */
    EDL_ENOTFOUND = -3,   /* key, lease or object does not exist */
    EDL_EUNAVAIL = -4,    /* no endpoint could be reached */
    EDL_ETIMEDOUT = -5,   /* the call's deadline passed */
    EDL_EPROTO = -6,      /* malformed or unexpected reply from a server */
    EDL_EAUTH = -7,       /* authentication failed or permission denied */
    EDL_ECOMPACTED = -8,  /* the requested revision was compacted */
    EDL_ELEASE = -9,      /* the lease expired or was revoked */
    EDL_ETOOBIG = -10,    /* a request or reply exceeds a size limit */
    EDL_ESERVER = -11,    /* the server refused the request */
    EDL_ECONFLICT = -12,  /* a compare failed: someone else changed the state */
    EDL_ECONFIG = -13,    /* invalid configuration */
    EDL_ECLOSED = -14,    /* the object was stopped or closed */
    EDL_EIO = -15,        /* local I/O error (files, pipes, processes) */
    EDL_EPEER = -16,      /* a collective's peer failed or its generation is gone: re-form */
};

/* Text for an EDL_E* code (or 0). Never NULL. */
const char *edl_strerror(int code);

/* Milliseconds on CLOCK_MONOTONIC: what every deadline and timeout in edl is measured on. */
int64_t edl_monotonic_ms(void);

/* A borrowed byte string: keys and values in etcd are binary-safe. */
typedef struct edl_buf {
    const char *data;
    size_t len;
} edl_buf;

static inline edl_buf edl_str(const char *s)
{
    edl_buf b = {s, s ? strlen(s) : 0};
    return b;
}

static inline edl_buf edl_bytes(const void *p, size_t n)
{
    edl_buf b = {(const char *)p, n};
    return b;
}

#ifdef __cplusplus
}
#endif
#endif
