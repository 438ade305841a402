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
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    if (timeout_ms > 0)
        cfg.timeout_ms = timeout_ms;
    int rc = edl_etcd_config_set_endpoints(&cfg, endpoints);
    edl_etcd *c = NULL;
    if (rc == 0)
        rc = edl_etcd_new(&cfg, &c);
    edl_etcd_config_free(&cfg);
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

