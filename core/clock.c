/* clock.c: the monotonic clock on which every edl deadline, timeout and latency is measured,
 * and condition variables that wait on it (a wall-clock jump must not cut or stretch a wait). */
#include <pthread.h>
#include <time.h>

#include "edl/common.h"

int64_t edl_monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t edl_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void edl_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

void edl_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ns = ts.tv_nsec + (ms > 0 ? ms : 0) * 1000000;
    ts.tv_sec += ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    pthread_cond_timedwait(cv, mu, &ts);
}

bool edl_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline_ms)
{
    if (deadline_ms < 0) {
        pthread_cond_wait(cv, mu);
        return true;
    }
    int64_t left = deadline_ms - edl_monotonic_ms();
    if (left <= 0)
        return false;
    edl_cond_wait_ms(cv, mu, left);
    return true;
}

int64_t edl_deadline_ms(int64_t timeout_ms)
{
    return timeout_ms < 0 ? -1 : edl_monotonic_ms() + timeout_ms;
}
