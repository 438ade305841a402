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

void trainer_init(trainer_proc *t)
{
    memset(t, 0, sizeof *t);
    t->progress_fd = -1;
    t->control_fd = -1;
    t->step = -1;
}

bool trainer_running(const trainer_proc *t)
{
    return t->pid > 0;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

int trainer_pipes(trainer_proc *t, int *child_control, int *child_progress)
{
    int ctl[2], prog[2];
    if (pipe2(ctl, O_CLOEXEC) < 0)
        return EDL_EIO;
    if (pipe2(prog, O_CLOEXEC) < 0) {
        close(ctl[0]);
        close(ctl[1]);
        return EDL_EIO;
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
                  int child_progress, char *err, size_t errlen)
{
    /* The two pipes, and only these, cross the exec, at fixed low numbers (shells such as dash
     * can only redirect fds 0-9); stdout and stderr are the agent's. */
    edl_spawn_opts so = {.argv = argv, .envp = envp, .new_group = true, .n_fds = 2,
                         .fds = {{child_control, AGENT_CONTROL_FD},
                                 {child_progress, AGENT_PROGRESS_FD}}};
    pid_t pid = 0;
    int rc = edl_spawn(&so, &pid, err, errlen);
    close(child_control);
    close(child_progress);
    if (rc) {
        close_fd(&t->control_fd);
        close_fd(&t->progress_fd);
        return rc;
    }
    t->pid = pid;
    t->stopping = false;
    t->kill_at_ms = 0;
    t->step = -1;
    t->blocked_since_ms = 0;
    t->ready = false;
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

void trainer_kill(trainer_proc *t)
{
    if (t->pid <= 0)
        return;
    t->stopping = true;
    t->kill_at_ms = 0;
    if (kill(-t->pid, SIGKILL) < 0)
        kill(t->pid, SIGKILL);
}

int trainer_tick(trainer_proc *t)
{
    if (t->pid <= 0 || !t->stopping || !t->kill_at_ms)
        return -1;
    int64_t left = t->kill_at_ms - edl_monotonic_ms();
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
    *wstatus = st;
    *by_agent = t->stopping;
    t->pid = 0;
    t->stopping = false;
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
 * (kept with when it began), or the end of one. 1 when something changed. */
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
