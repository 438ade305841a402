/* error.c: the text and name of every EDL_E* code, generated from EDL_ERRNO_MAP (edl/common.h),
 * and the one way a message goes into a caller's error buffer. */
#include "edl/common.h"

#include <stdarg.h>
#include <stdio.h>

int edl_errf(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

const char *edl_strerror(int code)
{
    switch (code) {
    case EDL_OK: return "success";
#define EDL_ERRNO_TEXT(name, value, text) case EDL_##name: return text;
    EDL_ERRNO_MAP(EDL_ERRNO_TEXT)
#undef EDL_ERRNO_TEXT
    }
    return "unknown error";
}

const char *edl_err_name(int code)
{
    switch (code) {
    case EDL_OK: return "EDL_OK";
#define EDL_ERRNO_NAME(name, value, text) case EDL_##name: return "EDL_" #name;
    EDL_ERRNO_MAP(EDL_ERRNO_NAME)
#undef EDL_ERRNO_NAME
    }
    return "EDL_E?";
}
