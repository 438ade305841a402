/* harness_client.c: etcd clients for tests, and small assertions on edl results. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/etcd.h"
#include "harness.h"

edl_etcd *harness_client(const char *endpoints, int timeout_ms)
{
    return harness_tls_client(endpoints, timeout_ms, NULL, NULL, NULL);
}

edl_etcd *harness_tls_client(const char *endpoints, int timeout_ms, const char *ca_file,
                             const char *cert_file, const char *key_file)
{
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    if (timeout_ms > 0)
        cfg.timeout_ms = timeout_ms;
    int rc = edl_etcd_config_set_endpoints(&cfg, endpoints);
    cfg.ca_file = ca_file ? strdup(ca_file) : NULL;
    cfg.cert_file = cert_file ? strdup(cert_file) : NULL;
    cfg.key_file = key_file ? strdup(key_file) : NULL;
    edl_etcd *c = NULL;
    if (rc == 0)
        rc = edl_etcd_open(&cfg, &c);
    edl_etcd_config_clear(&cfg);
    if (rc != 0)
        fail_msg("cannot create an etcd client for %s: %s", endpoints, edl_strerror(rc));
    return c;
}

void harness_put(edl_etcd *c, const char *key, const char *value)
{
    int rc = edl_etcd_put(c, edl_str(key), edl_str(value), NULL, NULL);
    if (rc != 0)
        fail_msg("put %s: %s: %s", key, edl_strerror(rc), edl_etcd_errmsg(c));
}

char *harness_get(edl_etcd *c, const char *key, char *out, size_t outlen)
{
    edl_kv *kv;
    int rc = edl_etcd_get(c, edl_str(key), &kv, NULL);
    if (rc == EDL_ENOTFOUND)
        return NULL;
    if (rc != 0)
        fail_msg("get %s: %s: %s", key, edl_strerror(rc), edl_etcd_errmsg(c));
    snprintf(out, outlen, "%s", kv->value);
    edl_kv_free(kv);
    return out;
}


void harness_open_etcd(int members, const char *const *extra_args, edl_etcd_server **srv,
                       edl_etcd **client)
{
    *srv = harness_etcd_open(members, extra_args);
    *client = harness_client(edl_etcd_server_endpoints(*srv), 0);
}

void harness_close_etcd(edl_etcd_server **srv, edl_etcd **client)
{
    edl_etcd_close(*client);
    edl_etcd_server_close(*srv);
    *client = NULL;
    *srv = NULL;
}

edl_etcd *harness_client_via_proxy(edl_etcd_server *srv, harness_proxy **proxy)
{
    *proxy = harness_proxy_open(edl_etcd_server_client_port(srv, 0));
    if (!*proxy)
        fail_msg("cannot start a proxy in front of etcd");
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", harness_proxy_port(*proxy));
    return harness_client(ep, 0);
}

void harness_close_proxied(edl_etcd *client, harness_proxy *proxy)
{
    edl_etcd_close(client);
    harness_proxy_close(proxy);
}

edl_watch_event *harness_next_event(edl_watch *w, int timeout_ms)
{
    for (;;) {
        edl_watch_event *ev;
        int rc = edl_watch_next(w, &ev, timeout_ms);
        if (rc != 0)
            fail_msg("no watch event within %d ms: %s", timeout_ms, edl_strerror(rc));
        if (ev->type != EDL_WATCH_PROGRESS)
            return ev;
        edl_watch_event_free(ev);
    }
}

char *harness_job_key(char *buf, size_t len, const char *job, edl_job_key_kind kind,
                      const char *name, int64_t gen)
{
    edl_job_keys k;
    if (edl_job_keys_init(&k, NULL, job) != 0)
        fail_msg("no keys for job \"%s\"", job);
    char *made = NULL;
    const char *key = NULL;
    switch (kind) {
    case EDL_KEY_SPEC: key = k.spec; break;
    case EDL_KEY_POD: key = made = edl_job_key_pod(&k, name); break;
    case EDL_KEY_STATUS: key = made = edl_job_key_status(&k, name); break;
    case EDL_KEY_LEADER: key = k.leader; break;
    case EDL_KEY_GENERATION: key = k.generation; break;
    case EDL_KEY_GEN: key = made = edl_job_key_gen(&k, gen, name); break;
    case EDL_KEY_CHECKPOINT: key = k.checkpoint; break;
    case EDL_KEY_OTHER: key = k.job; break;
    }
    if (!key || (size_t)snprintf(buf, len, "%s", key) >= len)
        fail_msg("the key of job \"%s\" does not fit %zu bytes", job, len);
    free(made);
    edl_job_keys_clear(&k);
    return buf;
}
