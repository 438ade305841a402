/* metrics.c: the parameter server's /metrics (edl/metrics.h's server, polled from edl-ps's main
 * thread): its counters (edl_ps_server_stats, atomics read without locks), the shards lost
 * and restored among them; and the wait for a signal that serves /metrics meanwhile. */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

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

int ps_wait_signal(const sigset_t *sigs, edl_metrics_server *m, int timeout_ms)
{
    if (!m) {
        struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
        int sig = timeout_ms < 0 ? sigwaitinfo(sigs, NULL) : sigtimedwait(sigs, NULL, &ts);
        return sig > 0 ? sig : 0;
    }
    int sfd = signalfd(-1, sigs, SFD_CLOEXEC | SFD_NONBLOCK);
    int64_t end = timeout_ms < 0 ? -1 : edl_monotonic_ms() + timeout_ms;
    for (;;) {
        struct signalfd_siginfo si;
        if (sfd >= 0 && read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            close(sfd);
            return (int)si.ssi_signo;
        }
        int64_t left = end < 0 ? -1 : end - edl_monotonic_ms();
        if (end >= 0 && left <= 0)
            break;
        int t = edl_metrics_timeout_ms(m);
        if (left >= 0 && (t < 0 || left < t))
            t = (int)left;
        struct pollfd pf[2] = {{.fd = edl_metrics_fd(m), .events = POLLIN},
                               {.fd = sfd, .events = POLLIN}};
        poll(pf, sfd >= 0 ? 2 : 1, sfd >= 0 ? t : (t < 0 || t > 100 ? 100 : t));
        edl_metrics_serve(m);
        if (sfd < 0) { /* no signalfd: look for the signal between polls */
            int sig = sigtimedwait(sigs, NULL, &(struct timespec){0, 0});
            if (sig > 0)
                return sig;
        }
    }
    if (sfd >= 0)
        close(sfd);
    return 0;
}
