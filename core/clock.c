/* clock.c: the monotonic clock on which every edl deadline, timeout and latency is measured. */
#include <time.h>

#include "edl/common.h"

int64_t edl_monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
