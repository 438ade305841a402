/* edl/agent_link.h: the trainer's side of the agent protocol (see docs/agent.md): how a training
 * process talks to the edl-agent that supervises it.
 *
 * The agent gives its trainer two pipes, named by environment variables:
 *   EDL_PROGRESS_FD  write end: the trainer writes one line per event (edl_progress_line):
 *                    "step <N>" after each finished step; "blocked <MS> <what>" when a
 *                    collective has been waiting on its peers for MS ms (libedlcoll writes it
 *                    once per call, after a second); "unblocked" when that call returned;
 *                    "ready" when a trainer the agent started ahead of its pod's membership
 *                    (EDL_GENERATION=0) has loaded what it needs and waits for its first
 *                    assignment: the agent registers the pod then; "graceful" when the trainer
 *                    stops at its next commit when told to leave (edl.torch says it at start):
 *                    the agent then tells it of a leave instead of sending SIGTERM at once;
 *                    assignment: the agent registers the pod then; "inprocess" when the
 *                    trainer re-forms in process (edl.torch says so as it starts): in a job
 *                    whose elastic mode is not given, its agent then sends it new generations
 *                    instead of restarting it (docs/elastic.md); "checkpoint save <MS> <BYTES>"
 *                    and "checkpoint load <MS> <BYTES>" after the trainer saved or loaded a
 *                    checkpoint of BYTES bytes in MS ms (the agent's /metrics); "distill
 *                    <IN_FLIGHT> <RETRIED>" from a distillation student: its batches in flight
 *                    to teachers now, and the tries it sent again so far (the agent's /metrics);
 *                    "total <N>": the training ends at step N (its pod status, and the time to
 *                    the end that `edl status --watch` estimates);
 *   EDL_CONTROL_FD   read end: the agent writes one JSON line per generation the trainer takes
 *                    part in (at start, then at every in-process re-form), the trainer's
 *                    assignment in it:
 *                    {"generation":N,"rank":R,"world_size":W,"master_addr":"...","master_port":P}
 *                    or, to a trainer that said "graceful" and whose pod leaves the job, a leave:
 *                    {"generation":N,"leave":true}: stop at the next commit that moves to
 *                    generation N or later, together with the others, and exit 0 (the agent
 *                    sends SIGTERM only after its grace period);
 *
 * A link holds everything (no global state). Without the variables (a trainer started by hand)
 * every call works and does nothing, so the same trainer also runs standalone. */
#ifndef EDL_AGENT_LINK_H
#define EDL_AGENT_LINK_H

#include <stdbool.h>
#include <stdint.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_AGENT_LINE_MAX (8 << 20) /* longest control line accepted (8 MiB) */

typedef struct edl_agent_link edl_agent_link;

/* A trainer's place in one generation, as a control line carries it. */
typedef struct edl_assignment {
    int64_t generation;
    int rank;
    int world_size;
    char master_addr[256]; /* rank 0's address and port (MASTER_ADDR, MASTER_PORT) */
    int master_port;
    bool leave; /* a leave line: only generation is set (the first generation without this pod) */
} edl_assignment;

/* Read EDL_PROGRESS_FD, EDL_CONTROL_FD, EDL_RANK, EDL_WORLD_SIZE, EDL_GENERATION; set the fds
 * non-blocking and close-on-exec. EDL_ECONFIG when a variable is set but not a valid open fd. */
int edl_agent_link_open(edl_agent_link **out);
void edl_agent_link_close(edl_agent_link *l);

/* Report a finished step (non-negative). Never blocks: when the pipe is full the report is
 * dropped (the next one supersedes it). EDL_EIO when the agent is gone. */
int edl_agent_link_report_step(edl_agent_link *l, int64_t step);
/* Report that a collective call has waited on its peers for ms so far (what: "allreduce #12 of
 * generation 3, waiting on rank 2"; cut to EDL_PROGRESS_WHAT_MAX), and that it returned. The
 * agent turns a wait longer than the job's progress timeout into the trainer state "hung". */
int edl_agent_link_report_blocked(edl_agent_link *l, int64_t ms, const char *what);
int edl_agent_link_report_unblocked(edl_agent_link *l);
/* Report that this trainer, started ahead of its pod's membership, is ready for its first
 * assignment (a no-op for one the agent started with an assignment). */
int edl_agent_link_report_ready(edl_agent_link *l);
/* Say that this trainer stops at its next commit when told to leave (it then reads leave lines
 * from edl_agent_link_poll). A trainer that never says it is stopped by SIGTERM as before. */
int edl_agent_link_report_graceful(edl_agent_link *l);
/* Say that this trainer re-forms in process (it reads new generations from the control pipe
 * and keeps running): once, as it starts. */
int edl_agent_link_report_inprocess(edl_agent_link *l);
/* Report a checkpoint saved (load false) or loaded: how long it took and its size, both
 * non-negative (EDL_EINVAL otherwise). Never blocks, as report_step. */
int edl_agent_link_report_checkpoint(edl_agent_link *l, bool load, int64_t ms, int64_t bytes);
/* Report a distillation student's batches in flight and its retries so far (edl/distill.h's
 * edl_distill_pending and stats.retried; non-negative, EDL_EINVAL otherwise). Never blocks. */
int edl_agent_link_report_distill(edl_agent_link *l, int64_t in_flight, int64_t retried);
/* Say that the training ends at step total (>= 1; EDL_EINVAL otherwise): once, when known. */
int edl_agent_link_report_total(edl_agent_link *l, int64_t total);

/* Non-blocking: 1 and *out filled when a newer generation than the current one arrived (the
 * link then takes its rank, world size and generation; for a leave line, out->leave and only
 * its generation), 0 when none, <0 on error (EDL_EIO:
 * the agent closed the pipe). Cheap enough for every step boundary. */
int edl_agent_link_poll(edl_agent_link *l, edl_assignment *out);

/* The control pipe's fd, to poll for readability next to other fds (-1: none). Read it only
 * through edl_agent_link_poll(). */
int edl_agent_link_fd(const edl_agent_link *l);

int edl_agent_link_rank(const edl_agent_link *l);       /* 0 when standalone */
int edl_agent_link_world_size(const edl_agent_link *l); /* 1 when standalone */
int64_t edl_agent_link_generation(const edl_agent_link *l); /* 0 when standalone */

/* The agent's side: one control line (JSON + '\n', malloc'ed; NULL when out of memory; a leave
 * line when a->leave), and its parser (EDL_EPROTO for anything malformed: a leave line holds
 * exactly "generation" and "leave":true). */
char *edl_assignment_encode(const edl_assignment *a);
int edl_assignment_parse(const char *line, size_t len, edl_assignment *out);

/* One progress line (without its '\n'), as the agent reads it. */
#define EDL_PROGRESS_WHAT_MAX 200
typedef enum edl_progress_kind {
    EDL_PROGRESS_STEP = 0, /* value: the step */
    EDL_PROGRESS_BLOCKED,  /* value: ms waited so far; what: in which call */
    EDL_PROGRESS_UNBLOCKED,
    EDL_PROGRESS_READY,    /* started ahead of membership: ready for the first assignment */
    EDL_PROGRESS_GRACEFUL, /* it stops at its next commit when told to leave */
    EDL_PROGRESS_INPROCESS, /* the trainer re-forms in process */
    EDL_PROGRESS_CHECKPOINT_SAVE, /* value: ms the save took; value2: its bytes */
    EDL_PROGRESS_CHECKPOINT_LOAD, /* value: ms the load took; value2: its bytes */
    EDL_PROGRESS_DISTILL,  /* value: batches in flight; value2: retries so far */
    EDL_PROGRESS_TOTAL,    /* value: the step the training ends at (>= 1) */
} edl_progress_kind;
typedef struct edl_progress_line {
    edl_progress_kind kind;
    int64_t value;
    int64_t value2; /* the second number of a checkpoint or distill line */
    char what[EDL_PROGRESS_WHAT_MAX + 1];
} edl_progress_line;
/* EDL_EPROTO for anything malformed (numbers are bounded by EDL_GENERATION_MAX). */
int edl_progress_line_parse(const char *line, size_t len, edl_progress_line *out);

#ifdef __cplusplus
}
#endif
#endif
