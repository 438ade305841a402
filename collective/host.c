/* host.c: the facts about this host that size the streaming engine's buffers, read once: the
 * cores this process may run on (its affinity mask, which a container's cpuset narrows) and the
 * size of one core's L2 cache (sysfs). The window and block sizes were measured on a 2-core VM
 * with 1 MiB of L2 per core; they are expressed here as shares of the L2 so that they scale with
 * the host instead of staying what suited that machine. */
#define _GNU_SOURCE
#include "internal.h"
#include "edl/proc.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FALLBACK_L2 (1u << 20) /* the test VM's, where the shares below were measured */
#define MIN_WINDOW (64u << 10)

static coll_host host;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

/* "1024K", "2M", "512" (bytes) as in sysfs cache/index<N>/size; 0 when unreadable. */
static size_t read_size(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    unsigned long v = 0;
    char unit = 0;
    int n = fscanf(f, "%lu%c", &v, &unit);
    fclose(f);
    if (n < 1)
        return 0;
    return unit == 'K' ? (size_t)v << 10 : unit == 'M' ? (size_t)v << 20 : (size_t)v;
}

static int read_int(const char *path)
{
    FILE *f = fopen(path, "r");
    int v = -1;
    if (f && fscanf(f, "%d", &v) != 1)
        v = -1;
    if (f)
        fclose(f);
    return v;
}

/* The L2 (unified or data) of cpu; 0 when sysfs does not say. */
static size_t l2_of(int cpu)
{
    for (int i = 0; i < 16; i++) {
        char p[128], type[16] = "";
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu%d/cache/index%d/level", cpu, i);
        int level = read_int(p);
        if (level < 0)
            break;
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu%d/cache/index%d/type", cpu, i);
        FILE *f = fopen(p, "r");
        if (f && fscanf(f, "%15s", type) != 1)
            type[0] = '\0';
        if (f)
            fclose(f);
        if (level != 2 || strcmp(type, "Instruction") == 0)
            continue;
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu%d/cache/index%d/size", cpu, i);
        return read_size(p);
    }
    return 0;
}

/* The L2 of the CPU this thread runs on, else cpu0's. */
static size_t l2_bytes(void)
{
    int cpu = sched_getcpu();
    size_t s = cpu > 0 ? l2_of(cpu) : 0;
    return s ? s : l2_of(0);
}

static void host_read(void)
{
    host.cores = edl_cpu_count();
    host.l2_bytes = l2_bytes();
    host.l2_known = host.l2_bytes != 0;
    if (!host.l2_known)
        host.l2_bytes = FALLBACK_L2;
}

const coll_host *coll_host_get(void)
{
    pthread_once(&host_once, host_read);
    return &host;
}

/* Every byte in flight between two local ranks sits in kernel buffers that both their cores
 * touch: the ring streams fastest while the in-flight bytes of the links a core serves stay
 * within a quarter of its L2 (measured: 512 KiB in flight over the whole host was best on 2
 * cores with 1 MiB each, at n = 2, 3 and 4, and past about 600 KiB the loopback fell off a
 * cliff). With more ranks than cores, the ranks share those cores' caches. */
size_t coll_local_window(const coll_host *h, int local_ranks)
{
    int n = local_ranks > 0 ? local_ranks : 1;
    int cores = h->cores < n ? h->cores : n;
    size_t w = (h->l2_bytes / 4 * (size_t)cores / (size_t)n) & ~(size_t)4095;
    return w < MIN_WINDOW ? MIN_WINDOW : w;
}

/* A slice of the sliced ring allreduce: half a core's L2, so that a block forwarded one step
 * after it arrived is still in cache (512 KiB measured best on 1 MiB of L2). */
size_t coll_default_block(const coll_host *h)
{
    return h->l2_bytes / 2;
}
