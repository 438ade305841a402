/* loop.c: the one event loop (edl/loop.h): one poll() per turn over the registered fds, the
 * sleep bounded by the earliest timer, then the fds' callbacks, the due timers' and the
 * after-turn callback. Registrations live in two arrays; a callback may add or delete any of
 * them during a turn (a deleted fd is skipped and swept after the turn). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "edl/common.h"
#include "edl/log.h"
#include "edl/loop.h"

typedef struct {
    int fd;             /* -1: followed through src; -2: deleted */
    int events;
    edl_loop_fd_src src;
    edl_loop_fd_fn fn;
    void *arg;
} fd_reg;

typedef struct {
    const int64_t *due;
    edl_loop_due_src src;
    edl_loop_fn fn;
    void *arg;
} timer_reg;

struct edl_loop {
    fd_reg *fds;
    size_t nfds, capfds;
    timer_reg *timers;
    size_t ntimers, captimers;
    struct pollfd *pf; /* one turn's, beside the index of each one's registration */
    size_t *pf_reg;
    size_t cappf;
    int max_sleep_ms;
    int sigfd;
    edl_loop_signal_fn on_signal;
    void *signal_arg;
    edl_loop_fn after;
    void *after_arg;
    bool stop;
    int code;
};

int edl_loop_open(int max_sleep_ms, edl_loop **out)
{
    edl_loop *l = calloc(1, sizeof *l);
    if (!l)
        return EDL_ENOMEM;
    l->max_sleep_ms = max_sleep_ms;
    l->sigfd = -1;
    *out = l;
    return 0;
}

void edl_loop_free(edl_loop *l)
{
    if (!l)
        return;
    if (l->sigfd >= 0)
        close(l->sigfd);
    free(l->fds);
    free(l->timers);
    free(l->pf);
    free(l->pf_reg);
    free(l);
}

static int grow(void **p, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 8;
    void *q = realloc(*p, c * size);
    if (!q)
        return EDL_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

static int add_fd(edl_loop *l, fd_reg r)
{
    for (size_t i = 0; r.fd >= 0 && i < l->nfds; i++)
        if (l->fds[i].fd == r.fd) {
            l->fds[i] = r;
            return 0;
        }
    if (grow((void **)&l->fds, &l->capfds, l->nfds, sizeof *l->fds))
        return EDL_ENOMEM;
    l->fds[l->nfds++] = r;
    return 0;
}

int edl_loop_fd_add(edl_loop *l, int fd, int events, edl_loop_fd_fn fn, void *arg)
{
    if (fd < 0)
        return EDL_EINVAL;
    return add_fd(l, (fd_reg){.fd = fd, .events = events, .fn = fn, .arg = arg});
}

void edl_loop_fd_del(edl_loop *l, int fd)
{
    for (size_t i = 0; fd >= 0 && i < l->nfds; i++)
        if (l->fds[i].fd == fd)
            l->fds[i].fd = -2;
}

int edl_loop_fd_follow(edl_loop *l, edl_loop_fd_src src, edl_loop_fd_fn fn, void *arg)
{
    return add_fd(l, (fd_reg){.fd = -1, .src = src, .fn = fn, .arg = arg});
}

static int add_timer(edl_loop *l, timer_reg t)
{
    if (grow((void **)&l->timers, &l->captimers, l->ntimers, sizeof *l->timers))
        return EDL_ENOMEM;
    l->timers[l->ntimers++] = t;
    return 0;
}

int edl_loop_timer_add(edl_loop *l, const int64_t *due_ms, edl_loop_fn fn, void *arg)
{
    return add_timer(l, (timer_reg){.due = due_ms, .fn = fn, .arg = arg});
}

int edl_loop_timer_follow(edl_loop *l, edl_loop_due_src src, edl_loop_fn fn, void *arg)
{
    return add_timer(l, (timer_reg){.src = src, .fn = fn, .arg = arg});
}

static void read_signals(edl_loop *l, int fd, int events, void *arg)
{
    (void)events;
    (void)arg;
    struct signalfd_siginfo si;
    while (read(fd, &si, sizeof si) == sizeof si)
        if (l->on_signal)
            l->on_signal(l, (int)si.ssi_signo, l->signal_arg);
}

void edl_loop_block_signals(int which, sigset_t *set)
{
    sigset_t own;
    set = set ? set : &own;
    sigemptyset(set);
    if (which & EDL_SIGNALS_STOP) {
        sigaddset(set, SIGTERM);
        sigaddset(set, SIGINT);
    }
    if (which & EDL_SIGNALS_CHILD)
        sigaddset(set, SIGCHLD);
    if (which & EDL_SIGNALS_HUP)
        sigaddset(set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, set, NULL);
}

int edl_loop_signals(edl_loop *l, int which, edl_loop_signal_fn fn, void *arg)
{
    if (l->sigfd >= 0)
        return EDL_EINVAL;
    sigset_t set;
    edl_loop_block_signals(which, &set);
    l->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (l->sigfd < 0)
        return EDL_EIO;
    l->on_signal = fn;
    l->signal_arg = arg;
    return edl_loop_fd_add(l, l->sigfd, EDL_LOOP_READ, read_signals, NULL);
}

static void complete_works(edl_loop *l, int fd, int events, void *arg)
{
    (void)l;
    (void)fd;
    (void)events;
    edl_worker_complete(arg);
}

int edl_loop_worker(edl_loop *l, edl_worker *wk)
{
    return edl_loop_fd_add(l, edl_worker_fd(wk), EDL_LOOP_READ, complete_works, wk);
}

void edl_loop_after_turn(edl_loop *l, edl_loop_fn fn, void *arg)
{
    l->after = fn;
    l->after_arg = arg;
}

static int64_t timer_due(const timer_reg *t)
{
    return t->src ? t->src(t->arg) : *t->due;
}

/* The sleep: to the earliest due timer, within the loop's and the caller's bounds. */
static int sleep_ms(const edl_loop *l, int max_ms)
{
    int64_t ms = l->max_sleep_ms;
    if (max_ms >= 0 && (ms < 0 || max_ms < ms))
        ms = max_ms;
    int64_t now = edl_monotonic_ms();
    for (size_t i = 0; i < l->ntimers; i++) {
        int64_t due = timer_due(&l->timers[i]);
        if (due <= 0)
            continue;
        int64_t left = due > now ? due - now : 0;
        if (ms < 0 || left < ms)
            ms = left;
    }
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* This turn's pollfds, from the fixed and the followed registrations. */
static size_t gather(edl_loop *l)
{
    if (l->cappf < l->nfds) {
        free(l->pf);
        free(l->pf_reg);
        l->pf = calloc(l->nfds, sizeof *l->pf);
        l->pf_reg = calloc(l->nfds, sizeof *l->pf_reg);
        l->cappf = l->pf && l->pf_reg ? l->nfds : 0;
        if (!l->cappf)
            return 0;
    }
    size_t n = 0;
    for (size_t i = 0; i < l->nfds; i++) {
        fd_reg *r = &l->fds[i];
        int events = r->events ? r->events : EDL_LOOP_READ;
        int fd = r->src ? r->src(r->arg, &events) : r->fd;
        if (fd < 0 || !events)
            continue;
        short pe = (short)(((events & EDL_LOOP_READ) ? POLLIN : 0) |
                           ((events & EDL_LOOP_WRITE) ? POLLOUT : 0));
        l->pf[n] = (struct pollfd){.fd = fd, .events = pe};
        l->pf_reg[n++] = i;
    }
    return n;
}

static int ready_events(short revents)
{
    int e = 0;
    if (revents & (POLLIN | POLLPRI | POLLHUP | POLLERR | POLLNVAL))
        e |= EDL_LOOP_READ;
    if (revents & (POLLOUT | POLLHUP | POLLERR | POLLNVAL))
        e |= EDL_LOOP_WRITE;
    return e;
}

static void dispatch_fds(edl_loop *l, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!l->pf[i].revents)
            continue;
        fd_reg r = l->fds[l->pf_reg[i]]; /* a copy: a callback may grow the array */
        if (r.fd == -2 || (!r.src && r.fd != l->pf[i].fd))
            continue; /* deleted or replaced during this turn */
        int want = (l->pf[i].events & POLLIN ? EDL_LOOP_READ : 0) |
                   (l->pf[i].events & POLLOUT ? EDL_LOOP_WRITE : 0);
        r.fn(l, l->pf[i].fd, ready_events(l->pf[i].revents) & want, r.arg);
    }
}

static void dispatch_timers(edl_loop *l)
{
    int64_t now = edl_monotonic_ms();
    for (size_t i = 0; i < l->ntimers; i++) {
        timer_reg t = l->timers[i];
        int64_t due = timer_due(&t);
        if (due > 0 && now >= due)
            t.fn(l, t.arg);
    }
}

static void sweep(edl_loop *l)
{
    size_t k = 0;
    for (size_t i = 0; i < l->nfds; i++)
        if (l->fds[i].fd != -2)
            l->fds[k++] = l->fds[i];
    l->nfds = k;
}

int edl_loop_turn(edl_loop *l, int max_ms)
{
    size_t n = gather(l);
    if (poll(l->pf, n, sleep_ms(l, max_ms)) < 0 && errno != EINTR) {
        EDL_ERROR("loop", "poll over %zu fds: %s", n, strerror(errno));
        return EDL_EIO;
    }
    dispatch_fds(l, n);
    dispatch_timers(l);
    if (l->after)
        l->after(l, l->after_arg);
    sweep(l);
    return 0;
}

int edl_loop_run(edl_loop *l)
{
    while (!l->stop)
        if (edl_loop_turn(l, -1) != 0)
            edl_loop_stop(l, EDL_EIO);
    l->stop = false; /* a later run turns again */
    return l->code;
}

void edl_loop_stop(edl_loop *l, int code)
{
    l->stop = true;
    l->code = code;
}

bool edl_loop_stopped(const edl_loop *l)
{
    return l->stop;
}
