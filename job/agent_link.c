/* agent_link.c: the trainer's side of the agent protocol (progress lines out, generation lines
 * in), and the control-line format that both sides share. See edl/agent_link.h. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/log.h"
#include "edl/agent_link.h"
#include "edl/job.h"
#include "edl/json.h"

struct edl_agent_link {
    int progress_fd; /* -1: standalone */
    int control_fd;  /* -1: standalone or the agent closed it */
    int rank, world_size;
    int64_t generation;
    char *line;      /* partial control line */
    size_t len, cap;
    bool skipping;   /* discarding an oversized line up to its newline */
};

/* An fd number from the environment: -1 when unset, EDL_ECONFIG when not an open fd. */
static int env_fd(const char *name, int *fd)
{
    const char *v = getenv(name);
    *fd = -1;
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (*end || errno || n < 0 || n > INT_MAX || fcntl((int)n, F_GETFD) < 0) {
        EDL_ERROR("agent-link", "%s=%s is not an open file descriptor", name, v);
        return EDL_ECONFIG;
    }
    *fd = (int)n;
    return 0;
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return dflt;
    long n = strtol(v, &end, 10);
    return *end ? dflt : n;
}

static void set_flags(int fd)
{
    fcntl(fd, F_SETFD, FD_CLOEXEC); /* a trainer's own children must not hold the pipes */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int edl_agent_link_open(edl_agent_link **out)
{
    *out = NULL;
    edl_agent_link *t = calloc(1, sizeof *t);
    if (!t)
        return EDL_ENOMEM;
    int rc = env_fd("EDL_PROGRESS_FD", &t->progress_fd);
    if (!rc)
        rc = env_fd("EDL_CONTROL_FD", &t->control_fd);
    if (rc) {
        free(t);
        return rc;
    }
    if (t->progress_fd >= 0)
        set_flags(t->progress_fd);
    if (t->control_fd >= 0)
        set_flags(t->control_fd);
    t->rank = (int)env_long("EDL_RANK", 0);
    t->world_size = (int)env_long("EDL_WORLD_SIZE", 1);
    t->generation = env_long("EDL_GENERATION", 0);
    *out = t;
    return 0;
}

void edl_agent_link_close(edl_agent_link *t)
{
    if (!t)
        return;
    if (t->progress_fd >= 0)
        close(t->progress_fd);
    if (t->control_fd >= 0)
        close(t->control_fd);
    free(t->line);
    free(t);
}

/* Write one progress line whole or not at all (shorter than PIPE_BUF); never blocks. */
static int write_progress(edl_agent_link *t, const char *line, int n)
{
    if (!t || n < 0)
        return EDL_EINVAL;
    if (t->progress_fd < 0)
        return 0;
    ssize_t w = write(t->progress_fd, line, (size_t)n);
    if (w < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    return w == n ? 0 : EDL_EIO;
}

int edl_agent_link_report_step(edl_agent_link *t, int64_t step)
{
    if (step < 0)
        return EDL_EINVAL;
    char buf[40];
    return write_progress(t, buf, snprintf(buf, sizeof buf, "step %lld\n", (long long)step));
}

int edl_agent_link_report_blocked(edl_agent_link *t, int64_t ms, const char *what)
{
    if (ms < 0 || !what)
        return EDL_EINVAL;
    char buf[EDL_PROGRESS_WHAT_MAX + 40];
    int n = snprintf(buf, sizeof buf, "blocked %lld %.*s", (long long)ms, EDL_PROGRESS_WHAT_MAX,
                     what);
    for (int i = 0; i < n; i++)
        if (buf[i] == '\n' || buf[i] == '\r')
            buf[i] = ' '; /* one line, whatever the text */
    buf[n++] = '\n';
    return write_progress(t, buf, n);
}

int edl_agent_link_report_unblocked(edl_agent_link *t)
{
    return write_progress(t, "unblocked\n", 10);
}

int edl_agent_link_report_ready(edl_agent_link *t)
{
    return t && t->generation == 0 ? write_progress(t, "ready\n", 6) : 0;
}

int edl_agent_link_report_graceful(edl_agent_link *t)
{
    return write_progress(t, "graceful\n", 9);
}

int edl_agent_link_report_inprocess(edl_agent_link *t)
{
    return write_progress(t, "inprocess\n", 10);
}

int edl_agent_link_report_checkpoint(edl_agent_link *t, bool load, int64_t ms, int64_t bytes)
{
    if (ms < 0 || bytes < 0 || ms > EDL_GENERATION_MAX || bytes > EDL_GENERATION_MAX)
        return EDL_EINVAL;
    char buf[80];
    return write_progress(t, buf, snprintf(buf, sizeof buf, "checkpoint %s %lld %lld\n",
                                           load ? "load" : "save", (long long)ms,
                                           (long long)bytes));
}

int edl_agent_link_report_distill(edl_agent_link *t, int64_t in_flight, int64_t retried)
{
    if (in_flight < 0 || retried < 0 || in_flight > EDL_GENERATION_MAX ||
        retried > EDL_GENERATION_MAX)
        return EDL_EINVAL;
    char buf[64];
    return write_progress(t, buf, snprintf(buf, sizeof buf, "distill %lld %lld\n",
                                           (long long)in_flight, (long long)retried));
}

int edl_agent_link_report_total(edl_agent_link *t, int64_t total)
{
    if (total < 1 || total > EDL_GENERATION_MAX)
        return EDL_EINVAL;
    char buf[40];
    return write_progress(t, buf, snprintf(buf, sizeof buf, "total %lld\n", (long long)total));
}

/* A decimal in [0, EDL_GENERATION_MAX] spanning s[0..len): 0 and *v, else EDL_EPROTO. */
static int parse_count(const char *s, size_t len, int64_t *v)
{
    int64_t x = 0;
    if (len == 0)
        return EDL_EPROTO;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9' || x > EDL_GENERATION_MAX / 10)
            return EDL_EPROTO;
        x = x * 10 + (s[i] - '0');
    }
    if (x > EDL_GENERATION_MAX)
        return EDL_EPROTO;
    *v = x;
    return 0;
}

/* "<N> <M>", the rest of a checkpoint or distill line, into value and value2: 0, else
 * EDL_EPROTO. */
static int parse_two(const char *s, size_t len, edl_progress_line *out)
{
    const char *sp = memchr(s, ' ', len);
    if (!sp)
        return EDL_EPROTO;
    size_t mlen = (size_t)(sp - s);
    if (parse_count(s, mlen, &out->value) || parse_count(sp + 1, len - mlen - 1, &out->value2))
        return EDL_EPROTO;
    return 0;
}

int edl_progress_line_parse(const char *line, size_t len, edl_progress_line *out)
{
    memset(out, 0, sizeof *out);
    if (len >= 5 && memcmp(line, "step ", 5) == 0) {
        out->kind = EDL_PROGRESS_STEP;
        return parse_count(line + 5, len - 5, &out->value);
    }
    if (len >= 6 && memcmp(line, "total ", 6) == 0) {
        out->kind = EDL_PROGRESS_TOTAL;
        return parse_count(line + 6, len - 6, &out->value) || out->value < 1 ? EDL_EPROTO : 0;
    }
    if (len == 9 && memcmp(line, "unblocked", 9) == 0) {
        out->kind = EDL_PROGRESS_UNBLOCKED;
        return 0;
    }
    if (len == 5 && memcmp(line, "ready", 5) == 0) {
        out->kind = EDL_PROGRESS_READY;
        return 0;
    }
    if (len == 8 && memcmp(line, "graceful", 8) == 0) {
        out->kind = EDL_PROGRESS_GRACEFUL;
        return 0;
    }
    if (len == 9 && memcmp(line, "inprocess", 9) == 0) {
        out->kind = EDL_PROGRESS_INPROCESS;
        return 0;
    }
    if (len >= 16 && (memcmp(line, "checkpoint save ", 16) == 0 ||
                      memcmp(line, "checkpoint load ", 16) == 0)) {
        out->kind = line[11] == 's' ? EDL_PROGRESS_CHECKPOINT_SAVE : EDL_PROGRESS_CHECKPOINT_LOAD;
        return parse_two(line + 16, len - 16, out);
    }
    if (len >= 8 && memcmp(line, "distill ", 8) == 0) {
        out->kind = EDL_PROGRESS_DISTILL;
        return parse_two(line + 8, len - 8, out);
    }
    if (len < 8 || memcmp(line, "blocked ", 8) != 0)
        return EDL_EPROTO;
    const char *num = line + 8, *sp = memchr(num, ' ', len - 8);
    size_t nlen = sp ? (size_t)(sp - num) : len - 8;
    out->kind = EDL_PROGRESS_BLOCKED;
    if (parse_count(num, nlen, &out->value))
        return EDL_EPROTO;
    size_t wlen = sp ? len - 8 - nlen - 1 : 0;
    if (wlen > EDL_PROGRESS_WHAT_MAX)
        return EDL_EPROTO;
    for (size_t i = 0; i < wlen; i++)
        if ((unsigned char)sp[1 + i] < 0x20)
            return EDL_EPROTO; /* no control characters: the text reaches logs and JSON */
    memcpy(out->what, sp ? sp + 1 : "", wlen);
    out->what[wlen] = '\0';
    return 0;
}

int edl_agent_link_fd(const edl_agent_link *t)
{
    return t ? t->control_fd : -1;
}

int edl_agent_link_rank(const edl_agent_link *t)
{
    return t ? t->rank : 0;
}

int edl_agent_link_world_size(const edl_agent_link *t)
{
    return t ? t->world_size : 1;
}

int64_t edl_agent_link_generation(const edl_agent_link *t)
{
    return t ? t->generation : 0;
}

/* Take one complete line (without '\n') out of the buffer: 1 when found. */
static int next_line(edl_agent_link *t, char **line, size_t *len)
{
    char *nl = memchr(t->line, '\n', t->len);
    if (!nl)
        return 0;
    *len = (size_t)(nl - t->line);
    *line = t->line;
    *nl = '\0';
    return 1;
}

static void consume(edl_agent_link *t, size_t n)
{
    memmove(t->line, t->line + n, t->len - n);
    t->len -= n;
}

/* Read one chunk into the line buffer (complete lines were taken out before): 1 when bytes
 * came, 0 when the pipe is empty, EDL_EIO once the agent is gone. A line that outgrows the
 * bound is dropped up to its newline. */
static int read_chunk(edl_agent_link *t)
{
    if (t->cap - t->len < 4096) {
        size_t cap = t->cap ? t->cap * 2 : 8192;
        if (cap > EDL_AGENT_LINE_MAX + 8192)
            cap = EDL_AGENT_LINE_MAX + 8192;
        if (cap - t->len < 1024) { /* no newline in the buffer: one line over the limit */
            EDL_WARN("agent-link", "control line over %d bytes ignored", EDL_AGENT_LINE_MAX);
            t->len = 0;
            t->skipping = true;
        } else if (cap != t->cap) {
            char *p = realloc(t->line, cap);
            if (!p)
                return EDL_ENOMEM;
            t->line = p;
            t->cap = cap;
        }
    }
    ssize_t n;
    do
        n = read(t->control_fd, t->line + t->len, t->cap - t->len - 1);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN)
        return 0;
    if (n <= 0)
        return EDL_EIO; /* EOF or a hard error */
    if (t->skipping) {
        char *nl = memchr(t->line + t->len, '\n', (size_t)n);
        if (!nl)
            return 1;
        size_t keep = (size_t)n - (size_t)(nl + 1 - (t->line + t->len));
        memmove(t->line, nl + 1, keep);
        t->len = keep;
        t->skipping = false;
        return 1;
    }
    t->len += (size_t)n;
    return 1;
}

int edl_agent_link_poll(edl_agent_link *t, edl_assignment *out)
{
    if (!t || !out)
        return EDL_EINVAL;
    if (t->control_fd < 0)
        return 0;
    int found = 0, rc;
    do {
        char *line;
        size_t len;
        while (t->len && next_line(t, &line, &len)) {
            edl_assignment g;
            int prc = edl_assignment_parse(line, len, &g);
            if (prc == 0 && g.generation > t->generation) {
                t->generation = g.generation;
                if (!g.leave) { /* a leaving trainer keeps its place until it exits */
                    t->rank = g.rank;
                    t->world_size = g.world_size;
                }
                *out = g;
                found = 1;
            } else if (prc != 0) {
                EDL_DEBUG("agent-link", "malformed control line ignored: %.200s", line);
            }
            consume(t, len + 1);
        }
    } while ((rc = read_chunk(t)) > 0);
    if (rc == EDL_EIO) {
        close(t->control_fd);
        t->control_fd = -1;
    }
    return found ? 1 : rc;
}

char *edl_assignment_encode(const edl_assignment *g)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "generation", (double)g->generation);
    if (g->leave) {
        cJSON_AddTrueToObject(o, "leave");
    } else {
        cJSON_AddNumberToObject(o, "rank", g->rank);
        cJSON_AddNumberToObject(o, "world_size", g->world_size);
        cJSON_AddStringToObject(o, "master_addr", g->master_addr);
        cJSON_AddNumberToObject(o, "master_port", g->master_port);
    }
    char *s = edl_json_print_consume(o);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    return line;
}

/* A leave line: {"generation":N,"leave":true} and nothing else. */
static int parse_leave(cJSON *o, edl_assignment *out)
{
    edl_assignment a = {.leave = true};
    edl_json_reader r = {o, "control line", NULL, 0, 0, true};
    bool leave = false;
    edl_json_i64(&r, "generation", 1, EDL_GENERATION_MAX, &a.generation);
    edl_json_bool(&r, "leave", &leave);
    if (r.rc || !leave || cJSON_GetArraySize(o) != 2)
        return EDL_EPROTO;
    *out = a;
    return 0;
}

int edl_assignment_parse(const char *line, size_t len, edl_assignment *out)
{
    memset(out, 0, sizeof *out);
    int rc;
    cJSON *o = edl_json_parse_object(line, len, EDL_AGENT_LINE_MAX, "control line", NULL, 0, &rc);
    if (!o)
        return EDL_EPROTO;
    if (cJSON_GetObjectItemCaseSensitive(o, "leave")) {
        rc = parse_leave(o, out);
        cJSON_Delete(o);
        return rc;
    }
    edl_assignment a = {0};
    const char *addr = NULL;
    edl_json_reader r = {o, "control line", NULL, 0, 0, true};
    edl_json_i64(&r, "generation", 1, EDL_GENERATION_MAX, &a.generation);
    edl_json_int(&r, "rank", 0, INT_MAX, &a.rank);
    edl_json_int(&r, "world_size", 1, INT_MAX, &a.world_size);
    edl_json_int(&r, "master_port", 0, 65535, &a.master_port);
    edl_json_cstr(&r, "master_addr", sizeof a.master_addr - 1, &addr);
    if (!r.rc && a.rank >= a.world_size)
        r.rc = EDL_EPROTO;
    if (!r.rc)
        snprintf(a.master_addr, sizeof a.master_addr, "%s", addr);
    cJSON_Delete(o);
    if (r.rc)
        return EDL_EPROTO;
    *out = a;
    return 0;
}
