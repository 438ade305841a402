/* metrics.c: the parameter server's /metrics (edl/metrics.h's server, polled from edl-ps's main
 * thread): its counters (edl_ps_server_stats and the sparse keys served, atomics read without
 * locks), the shards lost and restored among them; and the main thread's loop (edl/loop.h):
 * the wait for a signal that serves /metrics meanwhile. */
#define _GNU_SOURCE
#include <signal.h>

#include "edl/loop.h"
#include "edl/metrics.h"
#include "internal.h"

void ps_write_metrics(void *arg, edl_prom *p)
{
    const ps_metrics_src *m = arg;
    edl_ps_server_stats st;
    edl_ps_server_get_stats(m->s, &st);
    const char *labels[] = {"job", m->job, "pod", m->pod, NULL};
    p->labels = labels;
    edl_prom_metric(p, "edl_ps_up", "gauge", "1 while the server serves.", 1);
    edl_prom_metric(p, "edl_ps_tables", "gauge", "Tables held.", (int64_t)st.tables);
    edl_prom_metric(p, "edl_ps_rows", "gauge", "Sparse rows held.", (int64_t)st.rows);
    edl_prom_metric(p, "edl_ps_bytes", "gauge", "Bytes of table memory.", (int64_t)st.bytes);
    edl_prom_metric(p, "edl_ps_requests_total", "counter", "Requests served.",
                    (int64_t)st.requests);
    edl_prom_metric(p, "edl_ps_errors_total", "counter", "Requests answered with an error.",
                    (int64_t)st.errors);
    edl_prom_metric(p, "edl_ps_connections_total", "counter", "Connections accepted.",
                    (int64_t)st.connections);
    edl_prom_metric(p, "edl_ps_rejected_total", "counter", "Connections refused, evicted or "
                    "closed before they authenticated, or cut for breaking the protocol.",
                    (int64_t)st.rejected);
    edl_prom_metric(p, "edl_ps_pushes_total", "counter", "Pushes applied.", (int64_t)st.pushes);
    uint64_t pulled, pushed;
    ps_server_key_counts(m->s, &pulled, &pushed);
    edl_prom_family(p, "edl_ps_keys_total", "counter", "Sparse keys served, by operation: "
                    "rows pulled, and rows pushed and applied.");
    edl_prom_sample(p, "edl_ps_keys_total", "op", "pull", (int64_t)pulled);
    edl_prom_sample(p, "edl_ps_keys_total", "op", "push", (int64_t)pushed);
    edl_prom_metric(p, "edl_ps_shards_in_total", "counter", "Shards received from servers.",
                    (int64_t)st.shards_in);
    edl_prom_metric(p, "edl_ps_shards_out_total", "counter", "Shards handed to servers.",
                    (int64_t)st.shards_out);
    edl_prom_metric(p, "edl_ps_shards_lost_total", "counter", "Shards this server came to own "
                    "that no server handed over and no checkpoint held: they started again "
                    "from initial values.", (int64_t)st.shards_lost);
    edl_prom_metric(p, "edl_ps_shards_restored_total", "counter", "Such shards loaded from the "
                    "newest PS checkpoint instead.", (int64_t)st.shards_restored);
    p->labels = NULL;
}

static void on_signal(edl_loop *l, int sig, void *arg)
{
    ((ps_waiter *)arg)->sig = sig;
    edl_loop_stop(l, sig);
}

int ps_waiter_open(ps_waiter *w)
{
    *w = (ps_waiter){0};
    int rc = edl_loop_open(-1, &w->loop);
    return rc ? rc : edl_loop_signals(w->loop, EDL_SIGNALS_STOP, on_signal, w);
}

void ps_waiter_close(ps_waiter *w)
{
    edl_loop_free(w->loop);
    w->loop = NULL;
}

int ps_wait_signal(ps_waiter *w, int timeout_ms)
{
    int64_t end = timeout_ms < 0 ? -1 : edl_monotonic_ms() + timeout_ms;
    while (!w->sig) {
        int64_t left = end < 0 ? -1 : end - edl_monotonic_ms();
        if (end >= 0 && left <= 0)
            return 0;
        if (edl_loop_turn(w->loop, (int)left) != 0)
            return 0;
    }
    int sig = w->sig;
    w->sig = 0;
    return sig;
}
