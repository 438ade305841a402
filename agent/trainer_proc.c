/* trainer_proc.c: the trainer process, as the agent supervises it. It runs in its own process
 * group (so a stop reaches every process it started), dies with a SIGKILLed agent
 * (PR_SET_PDEATHSIG, as in a container: edl_spawn), and talks to the agent through two pipes:
 * progress lines in, control lines out. No other fd of the agent reaches the trainer. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "edl/log.h"

/* A checkpoint takes from a fraction of a second (a small model to a local disk) to minutes
 * (gigabytes to an object store). */
static const double CKPT_BOUNDS[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};

void trainer_init(trainer_proc *t)
{
    memset(t, 0, sizeof *t);
    t->progress_fd = -1;
    t->control_fd = -1;
    t->stderr_fd = -1;
    t->step = -1;
    t->distill_in_flight = -1;
    for (int i = 0; i < 2; i++) {
        t->ckpt_seconds[i].bounds = CKPT_BOUNDS;
        t->ckpt_seconds[i].n = sizeof CKPT_BOUNDS / sizeof CKPT_BOUNDS[0];
    }
}

bool trainer_running(const trainer_proc *t)
{
    return t->pid > 0;
}

static void trainer_read_stderr_line(trainer_proc *t);

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

int trainer_pipes(trainer_proc *t, int *child_control, int *child_progress, int *child_err)
{
    int ctl[2], prog[2], err[2] = {-1, -1};
    if (pipe2(ctl, O_CLOEXEC) < 0)
        return EDL_EIO;
    if (pipe2(prog, O_CLOEXEC) < 0) {
        close(ctl[0]);
        close(ctl[1]);
        return EDL_EIO;
    }
    if (child_err && pipe2(err, O_CLOEXEC) < 0) {
        close(ctl[0]);
        close(ctl[1]);
        close(prog[0]);
        close(prog[1]);
        return EDL_EIO;
    }
    if (child_err) {
        fcntl(err[0], F_SETFL, O_NONBLOCK);
        close_fd(&t->stderr_fd); /* a spawn that never happened left it */
        t->stderr_fd = err[0];
        *child_err = err[1];
    }
    /* Only the agent's ends are non-blocking: the flag belongs to the open file, and the
     * trainer's ends are the trainer's to choose (its library sets them non-blocking). */
    fcntl(ctl[1], F_SETFL, O_NONBLOCK);
    fcntl(prog[0], F_SETFL, O_NONBLOCK);
    t->control_fd = ctl[1];
    t->progress_fd = prog[0];
    *child_control = ctl[0];
    *child_progress = prog[1];
    return 0;
}

int trainer_spawn(trainer_proc *t, char *const *argv, char *const *envp, int child_control,
                  int child_progress, int child_err, char *err, size_t errlen)
{
    /* The two pipes, and only these, cross the exec, at fixed low numbers (shells such as dash
     * can only redirect fds 0-9); stdout is the agent's, stderr too or a pipe to it. */
    edl_spawn_opts so = {.argv = argv, .envp = envp, .new_group = true, .n_fds = 2,
                         .err = child_err >= 0 ? child_err : 0,
                         .fds = {{child_control, AGENT_CONTROL_FD},
                                 {child_progress, AGENT_PROGRESS_FD}}};
    pid_t pid = 0;
    int rc = edl_spawn(&so, &pid, err, errlen);
    close(child_control);
    close(child_progress);
    if (child_err >= 0)
        close(child_err);
    t->err_tail_next = 0;
    t->err_line_len = 0;
    if (rc) {
        close_fd(&t->control_fd);
        close_fd(&t->progress_fd);
        close_fd(&t->stderr_fd);
        return rc;
    }
    t->pid = pid;
    t->stopping = false;
    t->term_at_ms = 0;
    t->kill_at_ms = 0;
    t->step = -1;
    t->total = 0;
    t->blocked_since_ms = 0;
    t->ready = false;
    t->graceful = false;
    t->inprocess = false;
    t->distill_retried_seen = 0; /* a new client counts from 0 */
    t->line_len = 0;
    t->line_skip = false;
    return 0;
}

void trainer_stop(trainer_proc *t, int64_t grace_ms)
{
    if (t->pid <= 0 || t->stopping)
        return;
    t->stopping = true;
    t->kill_at_ms = edl_monotonic_ms() + grace_ms;
    if (kill(-t->pid, SIGTERM) < 0)
        kill(t->pid, SIGTERM);
}

int trainer_leave(trainer_proc *t, const char *line, int64_t grace_ms)
{
    if (t->pid <= 0 || t->stopping)
        return 0;
    int rc = trainer_send_control(t, line);
    if (rc)
        return rc;
    t->stopping = true;
    t->term_at_ms = edl_monotonic_ms() + grace_ms;
    t->kill_at_ms = t->term_at_ms + (grace_ms < TRAINER_LEAVE_KILL_MS ? grace_ms
                                                                      : TRAINER_LEAVE_KILL_MS);
    return 0;
}

void trainer_kill(trainer_proc *t)
{
    if (t->pid <= 0)
        return;
    t->stopping = true;
    t->term_at_ms = 0;
    t->kill_at_ms = 0;
    if (kill(-t->pid, SIGKILL) < 0)
        kill(t->pid, SIGKILL);
}

int trainer_tick(trainer_proc *t)
{
    if (t->pid <= 0 || !t->stopping || !t->kill_at_ms)
        return -1;
    int64_t now = edl_monotonic_ms();
    if (t->term_at_ms && now >= t->term_at_ms) {
        EDL_WARN("agent", "trainer %d told to leave did not reach a commit within the grace "
                 "period: SIGTERM", (int)t->pid);
        t->term_at_ms = 0;
        if (kill(-t->pid, SIGTERM) < 0)
            kill(t->pid, SIGTERM);
    }
    if (t->term_at_ms)
        return (int)(t->term_at_ms - now);
    int64_t left = t->kill_at_ms - now;
    if (left > 0)
        return (int)left;
    EDL_WARN("agent", "trainer %d did not stop within the grace period: SIGKILL", (int)t->pid);
    trainer_kill(t);
    return -1;
}

int trainer_reap(trainer_proc *t, int *wstatus, bool *by_agent)
{
    if (t->pid <= 0)
        return 0;
    int st;
    pid_t r = waitpid(t->pid, &st, WNOHANG);
    if (r != t->pid)
        return 0;
    /* What the trainer left behind in its group goes with it. */
    kill(-t->pid, SIGKILL);
    trainer_read_progress(t); /* the last lines it wrote */
    trainer_read_stderr(t, true); /* all of it: the pipe goes with the trainer */
    if (t->err_line_len) /* its last words, without a newline */
        trainer_read_stderr_line(t);
    close_fd(&t->stderr_fd);
    *wstatus = st;
    *by_agent = t->stopping;
    t->pid = 0;
    t->stopping = false;
    t->term_at_ms = 0;
    t->kill_at_ms = 0;
    close_fd(&t->progress_fd);
    close_fd(&t->control_fd);
    free(t->ctl_buf);
    t->ctl_buf = NULL;
    t->ctl_len = 0;
    return 1;
}

/* What /metrics counts of a new step: forward steps, when, and a trainer's first step. */
static void note_step(trainer_proc *t, int64_t step)
{
    t->last_step_wall_ms = edl_wall_ms();
    if (t->step < 0) {
        t->first_step_wall_ms = t->last_step_wall_ms;
        t->first_steps++;
    } else if (step > t->step) {
        t->steps_total += step - t->step;
    }
}

/* Take one complete progress line: a step (which also ends a wait), a wait in a collective
 * (kept with when it began), or the end of one, a checkpoint's time and size or a student's
 * batches (counted for /metrics). 1 when the trainer's status changed. */
static int take_line(trainer_proc *t, const char *line, size_t len)
{
    edl_progress_line pl;
    if (edl_progress_line_parse(line, len, &pl) != 0) {
        EDL_DEBUG("agent", "malformed progress line ignored: %.*s", (int)len, line);
        return 0;
    }
    switch (pl.kind) {
    case EDL_PROGRESS_STEP:
        t->blocked_since_ms = 0;
        if (t->step == pl.value)
            return 0;
        note_step(t, pl.value);
        t->step = pl.value;
        return 1;
    case EDL_PROGRESS_BLOCKED:
        t->blocked_since_ms = edl_monotonic_ms() - pl.value;
        if (t->blocked_since_ms <= 0)
            t->blocked_since_ms = 1;
        snprintf(t->blocked_what, sizeof t->blocked_what, "%s", pl.what);
        return 1;
    case EDL_PROGRESS_UNBLOCKED:
        t->blocked_since_ms = 0;
        return 1;
    case EDL_PROGRESS_READY:
        t->ready = true;
        return 1;
    case EDL_PROGRESS_GRACEFUL:
        t->graceful = true;
        return 0;
    case EDL_PROGRESS_INPROCESS:
        if (t->inprocess)
            return 0;
        t->inprocess = true;
        return 1;
    case EDL_PROGRESS_CHECKPOINT_SAVE:
    case EDL_PROGRESS_CHECKPOINT_LOAD: {
        int i = pl.kind == EDL_PROGRESS_CHECKPOINT_LOAD; /* for /metrics only: no change */
        edl_prom_observe(&t->ckpt_seconds[i], (double)pl.value / 1000.0);
        t->ckpt_bytes[i] += pl.value2;
        return 0;
    }
    case EDL_PROGRESS_TOTAL:
        if (t->total == pl.value)
            return 0;
        t->total = pl.value;
        return 1;
    case EDL_PROGRESS_DISTILL: /* for /metrics only: no change */
        t->distill_in_flight = pl.value;
        /* a lower count than the last is a new client's, counted from 0 (as rate() would) */
        t->distill_retried += pl.value2 - (pl.value2 >= t->distill_retried_seen
                                           ? t->distill_retried_seen : 0);
        t->distill_retried_seen = pl.value2;
        return 0;
    }
    return 0;
}

int trainer_progress_feed(trainer_proc *t, const char *buf, size_t n)
{
    int changed = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = buf[i];
        if (ch != '\n') {
            if (t->line_len < sizeof t->line - 1)
                t->line[t->line_len++] = ch;
            else
                t->line_skip = true; /* overlong: bounded, then ignored */
            continue;
        }
        size_t len = t->line_len;
        if (len && t->line[len - 1] == '\r')
            len--;
        if (!t->line_skip)
            changed |= take_line(t, t->line, len);
        t->line_len = 0;
        t->line_skip = false;
    }
    return changed;
}

int trainer_read_progress(trainer_proc *t)
{
    if (t->progress_fd < 0)
        return 0;
    int changed = 0;
    char buf[4096];
    for (;;) {
        ssize_t n = read(t->progress_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0) /* every writer closed: the trainer exited, or closed it on purpose */
                close_fd(&t->progress_fd);
            break;
        }
        changed |= trainer_progress_feed(t, buf, (size_t)n);
    }
    return changed;
}

/* Pass one stderr line on to the agent's stderr (whole: the launcher prefixes lines) and keep
 * it, as printable text, in the ring of last lines (blank lines are not kept). */
static void trainer_read_stderr_line(trainer_proc *t)
{
    char line[sizeof t->err_line + 1];
    memcpy(line, t->err_line, t->err_line_len);
    line[t->err_line_len] = '\n';
    stderr_relay_put(t->relay, line, t->err_line_len + 1);
    size_t n = t->err_line_len;
    t->err_line_len = 0;
    while (n && (line[n - 1] == '\r' || line[n - 1] == ' '))
        n--;
    if (!n)
        return;
    char *keep = t->err_tail[t->err_tail_next++ % TRAINER_TAIL_LINES];
    size_t k = n < sizeof t->err_tail[0] - 1 ? n : sizeof t->err_tail[0] - 1;
    for (size_t i = 0; i < k; i++)
        keep[i] = (unsigned char)line[i] < 0x20 || line[i] == 0x7f ? ' ' : line[i];
    keep[k] = '\0';
}

void trainer_read_stderr(trainer_proc *t, bool all)
{
    char buf[4096];
    while (t->stderr_fd >= 0 && (all || !t->relay || !stderr_relay_full(t->relay))) {
        ssize_t n = read(t->stderr_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                close_fd(&t->stderr_fd);
            return;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n')
                t->err_line[t->err_line_len++] = buf[i];
            if (buf[i] == '\n' || t->err_line_len == sizeof t->err_line)
                trainer_read_stderr_line(t);
        }
    }
}

void trainer_stderr_tail(const trainer_proc *t, char *out, size_t len)
{
    unsigned n = t->err_tail_next < TRAINER_TAIL_LINES ? t->err_tail_next : TRAINER_TAIL_LINES;
    unsigned last = t->err_tail_next - 1;
    out[0] = '\0';
    if (!n)
        return;
    /* the last line first: messages are cut to fit, and a traceback ends with its exception */
    size_t used = (size_t)snprintf(out, len, "%s", t->err_tail[last % TRAINER_TAIL_LINES]);
    for (unsigned i = t->err_tail_next - n; i < last && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%s", i == t->err_tail_next - n ?
                                 " (after: " : " | ", t->err_tail[i % TRAINER_TAIL_LINES]);
    if (n > 1 && used < len)
        snprintf(out + used, len - used, ")");
}

void trainer_flush_control(trainer_proc *t)
{
    while (t->control_fd >= 0 && t->ctl_len) {
        ssize_t n = write(t->control_fd, t->ctl_buf, t->ctl_len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n < 0) { /* EPIPE: the trainer closed its end; it does not want control lines */
            EDL_DEBUG("agent", "control pipe closed by the trainer");
            close_fd(&t->control_fd);
            t->ctl_len = 0;
            return;
        }
        memmove(t->ctl_buf, t->ctl_buf + n, t->ctl_len - (size_t)n);
        t->ctl_len -= (size_t)n;
    }
}

int trainer_send_control(trainer_proc *t, const char *line)
{
    if (t->control_fd < 0)
        return EDL_ECLOSED;
    size_t n = strlen(line);
    if (t->ctl_len + n > EDL_AGENT_LINE_MAX * (size_t)4) {
        EDL_WARN("agent", "trainer reads no control lines; dropping the backlog");
        t->ctl_len = 0;
    }
    char *b = realloc(t->ctl_buf, t->ctl_len + n);
    if (!b)
        return EDL_ENOMEM;
    memcpy(b + t->ctl_len, line, n);
    t->ctl_buf = b;
    t->ctl_len += n;
    trainer_flush_control(t);
    return 0;
}
