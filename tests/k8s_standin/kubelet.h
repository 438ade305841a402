/* kubelet.h: the stand-in kubelet's own types, shared by kubelet.c (the thread, pod records,
 * the pod lifecycle), kubelet_status.c (the pod status it writes), kubelet_volumes.c (the
 * volumes) and kubelet_exec.c (environment, commands, fork/exec). Not used elsewhere. */
#ifndef K8S_STANDIN_KUBELET_H
#define K8S_STANDIN_KUBELET_H

#include <limits.h>
#include <sys/types.h>

#include "standin.h"

enum kc_state { KC_WAITING, KC_RUNNING, KC_TERMINATED };

typedef struct kcont {
    char name[64];
    bool init;
    pid_t pid; /* > 0 while running */
    enum kc_state state;
    char reason[64], message[512];
    int exit_code, restarts;
    time_t started, finished;
    int64_t start_at_ms; /* a (re)start is due then; 0 = none pending */
    bool has_last;       /* lastState.terminated */
    int last_exit;
    char last_reason[64];
    time_t last_started, last_finished;
} kcont;

enum kp_stage { KP_VOLUMES, KP_INIT, KP_MAIN, KP_DONE };

typedef struct kpod {
    struct kpod *next;
    char ns[256], name[256], uid[64];
    char dir[PATH_MAX];
    cJSON *pod; /* the pod when it was admitted (its spec does not change) */
    kcont *init, *main;
    int n_init, n_main, init_index;
    enum kp_stage stage;
    int64_t volumes_at_ms;
    char phase[16];
    time_t start_time, t_scheduled, t_initialized, t_ready;
    bool ready;
    bool deleting;
    int64_t kill_at_ms;
    bool dirty; /* status to write */
} kpod;

struct si_kubelet {
    si_server *srv;
    pthread_t thread;
    si_watch w;
    volatile int stop;
    kpod *pods;
};

int64_t kl_now_ms(void);
/* kubelet_volumes.c */
/* Make the pod's directory and volumes; 0, or -1 with the reason in err. */
int kl_prepare_volumes(si_server *srv, kpod *kp, char *err, size_t errlen);
/* kubelet_exec.c */
/* Start container c of kp (the store mutex is taken inside while reading secrets). 0 when
 * it runs; -1 with c set to waiting (reason, message) or terminated (StartError). */
int kl_start_container(si_server *srv, kpod *kp, kcont *c);
/* kubelet_status.c */
cJSON *kl_build_status(const kpod *kp);
void kl_write_status(si_server *srv, kpod *kp);

#endif
