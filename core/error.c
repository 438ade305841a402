/* error.c: text for the EDL_E* codes of edl/common.h. */
#include "edl/common.h"

const char *edl_strerror(int code)
{
    switch (code) {
    case EDL_OK: return "success";
    case EDL_EINVAL: return "invalid argument";
    case EDL_ENOMEM: return "out of memory";
    case EDL_ENOTFOUND: return "not found";
    case EDL_EUNAVAIL: return "no endpoint reachable";
    case EDL_ETIMEDOUT: return "timed out";
    case EDL_EPROTO: return "malformed reply from server";
    case EDL_EAUTH: return "authentication failed or permission denied";
    case EDL_ECOMPACTED: return "revision compacted";
    case EDL_ELEASE: return "lease expired or revoked";
    case EDL_ETOOBIG: return "size limit exceeded";
    case EDL_ESERVER: return "request refused by server";
    case EDL_ECONFLICT: return "compare failed (state changed concurrently)";
    case EDL_ECONFIG: return "invalid configuration";
    case EDL_ECLOSED: return "closed";
    case EDL_EIO: return "I/O error";
    case EDL_EPEER: return "a peer failed or the generation is gone";
    }
    return "unknown error";
}
