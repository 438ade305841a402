/* etcd_demo.c: a short tour of edl's etcd layer, against an etcd it starts itself.
 *
 * Three simulated pods register under leases kept alive in the background; a job-server
 * stand-in wins the election, watches the membership and publishes a numbered generation
 * (a txn fenced by its leadership) each time membership changes. Then one pod leaves
 * gracefully (its lease is revoked: a new generation at once) and one pod "crashes" (it stops
 * renewing: a new generation when its lease expires). The elastic agent and the real job
 * server build on exactly these calls. Usage: etcd_demo [--ttl SECONDS] [--endpoints URL] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "edl/etcd.h"
#include "edl/etcd_server.h"
#include "edl/job.h"
#include "edl/log.h"

#define PODS 3

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void check(edl_etcd *c, int rc, const char *what)
{
    if (rc) {
        fprintf(stderr, "etcd_demo: %s: %s\n  %s\n", what, edl_strerror(rc), edl_etcd_errmsg(c));
        exit(1);
    }
}

typedef struct pod {
    char name[16];
    int64_t lease;
    edl_lease_keeper *keeper;
} pod;

static void pod_join(edl_etcd *c, const edl_job_keys *k, pod *p, int i, int64_t ttl)
{
    snprintf(p->name, sizeof p->name, "pod-%d", i);
    check(c, edl_etcd_lease_grant(c, ttl, 0, &p->lease, NULL), "lease grant");
    char val[128], *key = edl_job_key_pod(k, p->name);
    snprintf(val, sizeof val, "{\"role\":\"worker\",\"addr\":\"127.0.0.1:%d\"}", 29500 + i);
    edl_put_opts po = {.lease = p->lease};
    check(c, edl_etcd_put(c, edl_str(key), edl_str(val), &po, NULL), "register pod");
    free(key);
    check(c, edl_lease_keeper_open(c, p->lease, ttl, NULL, NULL, &p->keeper), "lease keeper");
    printf("  %s joined (lease %llx, TTL %lld s, kept alive every %lld ms)\n", p->name,
           (unsigned long long)p->lease, (long long)ttl, (long long)ttl * 1000 / 3);
}

/* Read the members and publish them as the next generation, fenced by leadership. */
static int64_t publish(edl_etcd *c, const edl_job_keys *k, const edl_leader *me, int64_t gen)
{
    edl_range_result r;
    edl_range_opts o = {.prefix = true, .keys_only = true};
    check(c, edl_etcd_range(c, edl_str(k->pods), &o, &r), "read members");
    cJSON *cl = cJSON_CreateObject(), *members = cJSON_AddArrayToObject(cl, "members");
    cJSON_AddNumberToObject(cl, "generation", (double)gen);
    printf("generation %lld:", (long long)gen);
    for (size_t i = 0; i < r.n_kvs; i++) {
        const char *name = strrchr(r.kvs[i].key, '/') + 1;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "pod", name);
        cJSON_AddNumberToObject(m, "rank", (double)i);
        cJSON_AddItemToArray(members, m);
        printf(" %s=rank%zu", name, i);
    }
    printf("%s\n", r.n_kvs ? "" : " (no members)");
    char *json = cJSON_PrintUnformatted(cl);
    edl_txn *t = edl_txn_new();
    edl_txn_cmp_leader(t, me);
    edl_txn_put(t, EDL_TXN_SUCCESS, edl_str(k->generation), edl_str(json), NULL);
    edl_txn_result tr;
    check(c, edl_etcd_txn(c, t, &tr), "publish generation");
    if (!tr.succeeded) {
        fprintf(stderr, "etcd_demo: lost leadership; not publishing\n");
        exit(1);
    }
    int64_t rev = tr.revision; /* watching from after our own write keeps the watch in sync */
    edl_txn_result_clear(&tr);
    edl_txn_free(t);
    free(json);
    cJSON_Delete(cl);
    edl_range_result_clear(&r);
    return rev;
}

/* Wait for the next membership change and publish a generation for it. */
static void await_change(edl_etcd *c, const edl_job_keys *k, edl_watch *w, const edl_leader *me,
                         int64_t *gen, double since, const char *why)
{
    edl_watch_event *ev;
    for (;;) {
        check(c, edl_watch_next(w, &ev, 30000), "watch members");
        if (ev->type == EDL_WATCH_PUT || ev->type == EDL_WATCH_DELETE)
            break;
        edl_watch_event_free(ev);
    }
    printf("  %s %s at revision %lld, %.0f ms after %s\n", ev->kv.key + strlen(k->pods),
           ev->type == EDL_WATCH_DELETE ? "left" : "changed", (long long)ev->revision,
           (now_s() - since) * 1e3, why);
    edl_watch_event_free(ev);
    publish(c, k, me, ++*gen);
}

int main(int argc, char **argv)
{
    int64_t ttl = 3;
    const char *endpoints = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ttl") && i + 1 < argc)
            ttl = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--endpoints") && i + 1 < argc)
            endpoints = argv[++i];
        else {
            printf("usage: %s [--ttl SECONDS] [--endpoints URL]\n"
                   "A tour of edl's etcd layer: pods under leases, an elected job server, generations.\n"
                   "Without --endpoints it starts its own etcd on a free loopback port.\n", argv[0]);
            return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
        }
    }
    if (ttl < 1 || ttl > 60) {
        fprintf(stderr, "etcd_demo: --ttl must be 1..60 seconds\n");
        return 2;
    }
    edl_log_setup_from_env();
    edl_etcd_server *srv = NULL;
    if (!endpoints) {
        printf("starting etcd on loopback...\n");
        edl_etcd_server_opts so = {.quiet = true};
        double t0 = now_s();
        if (edl_etcd_server_open(&so, &srv) != 0) {
            fprintf(stderr, "etcd_demo: could not start etcd (is etcd-server installed? scripts/install-deps)\n");
            return 1;
        }
        endpoints = edl_etcd_server_endpoints(srv);
        printf("etcd is up at %s (%.1f s)\n", endpoints, now_s() - t0);
    }
    edl_etcd *c;
    if (edl_etcd_open_endpoints(endpoints, &c) != 0) {
        fprintf(stderr, "etcd_demo: bad endpoint list '%s'\n", endpoints);
        return 2;
    }

    edl_job_keys k; /* the keys of job "demo", as the agent and the job server name them */
    if (edl_job_keys_init(&k, NULL, "demo") != 0)
        return 1;
    int64_t js_lease;
    edl_leader me = {0};
    check(c, edl_etcd_lease_grant(c, 10, 0, &js_lease, NULL), "job server lease");
    check(c, edl_election_campaign(c, edl_str(k.leader), edl_str("jobserver-0"), js_lease, 5000, &me),
          "campaign");
    printf("job server: leader of job 'demo' (term = create revision %lld)\n", (long long)me.kv->create_revision);

    pod pods[PODS];
    for (int i = 0; i < PODS; i++)
        pod_join(c, &k, &pods[i], i, ttl);
    int64_t gen = 1;
    int64_t rev = publish(c, &k, &me, gen);

    edl_watch *w;
    edl_watch_opts wo = {.prefix = true, .start_revision = rev + 1};
    check(c, edl_watch_open(c, edl_str(k.pods), &wo, &w), "watch members");

    printf("%s leaves gracefully: the keeper revokes its lease\n", pods[1].name);
    double t0 = now_s();
    edl_lease_keeper_close(pods[1].keeper, true);
    await_change(c, &k, w, &me, &gen, t0, "the revoke");

    printf("%s crashes: nobody renews its lease any more\n", pods[2].name);
    t0 = now_s();
    edl_lease_keeper_close(pods[2].keeper, false);
    await_change(c, &k, w, &me, &gen, t0, "the crash (the lease TTL)");

    edl_kv *cur;
    check(c, edl_etcd_get(c, edl_str(k.generation), &cur, NULL), "read the generation");
    printf("published %s: %s\n", k.generation, cur->value);
    edl_kv_free(cur);

    edl_watch_close(w);
    edl_lease_keeper_close(pods[0].keeper, true);
    check(c, edl_election_resign(c, &me), "resign");
    edl_leader_clear(&me);
    edl_etcd_lease_revoke(c, js_lease);
    edl_etcd_close(c);
    edl_etcd_server_close(srv);
    edl_job_keys_clear(&k);
    printf("done\n");
    return 0;
}
