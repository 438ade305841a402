/* edl/trainer.h: the trainer's side of the agent protocol (see docs/agent.md).
 *
 * The agent gives its trainer two pipes, named by environment variables:
 *   EDL_PROGRESS_FD  write end: the trainer writes "step <N>\n" after each finished step;
 *   EDL_CONTROL_FD   read end: the agent writes one JSON line per generation the trainer takes
 *                    part in (at start, then at every in-process re-form):
 *                    {"generation":N,"rank":R,"world_size":W,"master_addr":"...",
 *                     "master_port":P,"endpoints":"a:p,b:p"}
 *
 * A handle holds everything (no global state). Without the variables (a trainer started by
 * hand) every call works and does nothing, so the same trainer also runs standalone. */
#ifndef EDL_TRAINER_H
#define EDL_TRAINER_H

#include <stdint.h>

#include "edl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_TRAINER_LINE_MAX (8 << 20) /* longest control line accepted (8 MiB) */

typedef struct edl_trainer edl_trainer;

typedef struct edl_trainer_generation {
    int64_t generation;
    int rank;
    int world_size;
    char master_addr[256];
    int master_port;
    char *endpoints; /* "addr:port,..." in rank order; owned by the handle, valid until the next
                      * edl_trainer_poll() or edl_trainer_close() */
} edl_trainer_generation;

/* Read EDL_PROGRESS_FD, EDL_CONTROL_FD, EDL_RANK, EDL_WORLD_SIZE, EDL_GENERATION; set the fds
 * non-blocking and close-on-exec. EDL_ECONFIG when a variable is set but not a valid open fd. */
int edl_trainer_open(edl_trainer **out);
void edl_trainer_close(edl_trainer *t);

/* Report a finished step (non-negative). Never blocks: when the pipe is full the report is
 * dropped (the next one supersedes it). EDL_EIO when the agent is gone. */
int edl_trainer_report_step(edl_trainer *t, int64_t step);

/* Non-blocking: 1 and *out filled when a newer generation than the current one arrived (the
 * handle then takes its rank, world size and generation), 0 when none, <0 on error (EDL_EIO:
 * the agent closed the pipe). Cheap enough for every step boundary. */
int edl_trainer_poll(edl_trainer *t, edl_trainer_generation *out);

/* The control pipe's fd, to poll for readability next to other fds (-1: none). Read it only
 * through edl_trainer_poll(). */
int edl_trainer_control_fd(const edl_trainer *t);

int edl_trainer_rank(const edl_trainer *t);       /* 0 when standalone */
int edl_trainer_world_size(const edl_trainer *t); /* 1 when standalone */
/* The current generation, 0 when standalone. (Not edl_trainer_generation(): in C that name is
 * the struct's typedef.) */
int64_t edl_trainer_generation_id(const edl_trainer *t);

/* The agent's side: one control line (JSON + '\n', malloc'ed; NULL when out of memory), and
 * its parser (EDL_EPROTO for anything malformed; out->endpoints is malloc'ed, caller frees). */
char *edl_trainer_control_encode(const edl_trainer_generation *g);
int edl_trainer_control_parse(const char *line, size_t len, edl_trainer_generation *out);

#ifdef __cplusplus
}
#endif
#endif
