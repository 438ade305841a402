/* jobserver.h: one job server replica for one job: campaign for leadership, then reconcile the
 * job from consistent etcd snapshots and publish generations with fenced txns. */
#ifndef EDL_JOBSERVER_H
#define EDL_JOBSERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "edl/etcd.h"

typedef struct js_config {
    const edl_etcd_config *etcd; /* endpoints, TLS and auth (checked) */
    char *job;
    char *prefix;      /* key prefix (EDL_DEFAULT_PREFIX) */
    char *id;          /* this replica's identity (hostname-pid) */
    int64_t ttl_s;     /* leadership lease TTL: a standby takes over within it (10) */
    int metrics_port;  /* 0: no /metrics; EDL_METRICS_PORT_AUTO: a free port */
    char *metrics_addr; /* its listen address (NULL: 0.0.0.0) */
    bool exit_when_done; /* exit once the job is final (0 succeeded, 1 failed, 4 stopped) */
} js_config;

/* Runs until SIGTERM/SIGINT (returns 0 after resigning), or a bad configuration (returns
 * EDL_EXIT_USAGE); an unreachable etcd is retried for ever, one that refuses our certificate or
 * credentials is EDL_EXIT_UNREACHABLE. With exit_when_done, the job's final
 * state as an exit code (edl_job_exit_code). SIGTERM and SIGINT arrive on its loop's signalfd
 * (block them before any thread starts). */
int js_run(const js_config *cfg);

#endif
