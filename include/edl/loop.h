/* edl/loop.h: the one event loop under every edl program, of the shape of Redis's ae: fds and
 * timers registered once with their callbacks, signals (a signalfd) and the works' queue
 * (edl/work.h) built in, and one edl_loop_run until a callback calls edl_loop_stop.
 *
 * An fd is registered as a number (edl_loop_fd_add) or, when it comes and goes with a part of
 * the program (a trainer's pipe, a watch's queue), as a function asked before every sleep
 * (edl_loop_fd_follow: -1 while there is none). A timer follows a due time the program keeps
 * (edl_loop_timer_add: a field, monotonic ms, 0 for none) or computes (edl_loop_timer_follow):
 * the loop sleeps no longer than the earliest one and calls its callback once it passed; the
 * callback moves or clears the due time, or it runs again at the next turn. So a program sets
 * when, in one place, and the loop does the waiting arithmetic. Every callback runs on the
 * loop's thread; the after-turn callback runs after each wake-up's callbacks (a reconcile). */
#ifndef EDL_LOOP_H
#define EDL_LOOP_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "edl/work.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct edl_loop edl_loop;

enum { EDL_LOOP_READ = 1, EDL_LOOP_WRITE = 2 };

typedef void (*edl_loop_fd_fn)(edl_loop *l, int fd, int events, void *arg);
typedef void (*edl_loop_fn)(edl_loop *l, void *arg);
typedef void (*edl_loop_signal_fn)(edl_loop *l, int signo, void *arg);
/* The fd to poll now (-1: none this turn), with *events the EDL_LOOP_* wanted (READ if unset). */
typedef int (*edl_loop_fd_src)(void *arg, int *events);
/* When the timer is due (edl_monotonic_ms; 0: not due at all). */
typedef int64_t (*edl_loop_due_src)(void *arg);

/* A loop that sleeps at most max_sleep_ms at a time (-1: as long as nothing is due).
 * EDL_ENOMEM. */
int edl_loop_open(int max_sleep_ms, edl_loop **out);
/* Free the loop: its signalfd is closed (the signals stay blocked); registered fds are not. */
void edl_loop_free(edl_loop *l);

/* Poll fd for events; a second add of the same fd replaces its registration. EDL_ENOMEM. */
int edl_loop_fd_add(edl_loop *l, int fd, int events, edl_loop_fd_fn fn, void *arg);
void edl_loop_fd_del(edl_loop *l, int fd);
/* Poll whatever fd src names before each sleep. EDL_ENOMEM. */
int edl_loop_fd_follow(edl_loop *l, edl_loop_fd_src src, edl_loop_fd_fn fn, void *arg);

/* Call fn once *due_ms (monotonic ms; 0: none) has passed; *due_ms stays the caller's. */
int edl_loop_timer_add(edl_loop *l, const int64_t *due_ms, edl_loop_fn fn, void *arg);
/* As edl_loop_timer_add with the due time asked of src before each sleep. */
int edl_loop_timer_follow(edl_loop *l, edl_loop_due_src src, edl_loop_fn fn, void *arg);

/* The signals a program takes, or'ed: STOP is SIGTERM and SIGINT (every program), CHILD is
 * SIGCHLD (a program that runs children), HUP is SIGHUP. */
enum { EDL_SIGNALS_STOP = 1, EDL_SIGNALS_CHILD = 2, EDL_SIGNALS_HUP = 4 };
/* Block which's signals in this thread, and fill *set with them when set is not NULL. Call it
 * before any thread starts (a client's, a server's loops), so every thread inherits the mask
 * and the signals wait for the loop's signalfd; edl_loop_signals calls it too. */
void edl_loop_block_signals(int which, sigset_t *set);
/* Block which's signals (edl_loop_block_signals) and call fn for each one that arrives. Once
 * per loop. EDL_EIO (no signalfd), EDL_EINVAL (a second time). */
int edl_loop_signals(edl_loop *l, int which, edl_loop_signal_fn fn, void *arg);
/* Complete wk's finished works (edl_worker_complete) when its fd wakes the loop. */
int edl_loop_worker(edl_loop *l, edl_worker *wk);
/* Call fn after every wake-up, once the fds' and timers' callbacks ran. */
void edl_loop_after_turn(edl_loop *l, edl_loop_fn fn, void *arg);

/* Turn until edl_loop_stop: the code it was given. */
int edl_loop_run(edl_loop *l);
/* One turn: wait up to the earliest due time (or max_ms when sooner; -1: no bound of its own),
 * run the callbacks. 0, or EDL_EIO when the wait itself failed. */
int edl_loop_turn(edl_loop *l, int max_ms);
/* Make edl_loop_run return code once the running turn ends. */
void edl_loop_stop(edl_loop *l, int code);
bool edl_loop_stopped(const edl_loop *l);

#ifdef __cplusplus
}
#endif
#endif
