/* proc_usage.h: what a process costs, read from /proc, for the benchmarks that report the
 * resident memory and CPU of edl's programs (reform, operator). Header-only: each benchmark is
 * a program of its own. */
#ifndef EDL_BENCH_PROC_USAGE_H
#define EDL_BENCH_PROC_USAGE_H

#include <stdio.h>
#include <string.h>
#include <sys/types.h>

/* utime+stime of a process in clock ticks, and its resident set in KiB (0 when unreadable). */
static inline void proc_usage(pid_t pid, long *ticks, long *rss_kib)
{
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    *ticks = 0;
    if (f && fgets(buf, sizeof buf, f)) {
        char *p = strrchr(buf, ')');
        unsigned long ut = 0, st = 0;
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
                        &st) == 2)
            *ticks = (long)(ut + st);
    }
    if (f)
        fclose(f);
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    *rss_kib = 0;
    while (f && fgets(buf, sizeof buf, f))
        if (sscanf(buf, "VmRSS: %ld", rss_kib) == 1)
            break;
    if (f)
        fclose(f);
}

/* What a process's resident memory is made of, in KiB, from /proc/PID/smaps_rollup: rss (all
 * its resident pages), pss (each shared page divided among the processes that map it) and anon
 * (its own memory: heap, stacks, the libraries' relocated data); rss - anon is the pages of
 * files it maps, shared library code mostly. All 0 when unreadable. */
typedef struct proc_mem {
    long rss, pss, anon;
} proc_mem;

static inline proc_mem proc_memory(pid_t pid)
{
    char path[64], buf[256];
    proc_mem m = {0, 0, 0};
    snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
    FILE *f = fopen(path, "r");
    while (f && fgets(buf, sizeof buf, f))
        if (sscanf(buf, "Rss: %ld", &m.rss) != 1 && sscanf(buf, "Pss: %ld", &m.pss) != 1)
            sscanf(buf, "Anonymous: %ld", &m.anon);
    if (f)
        fclose(f);
    return m;
}

#endif
