/* harness_ps.c: parameter servers in the test's own process, and clients of them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

void harness_ps_secret(edl_job_secret *s, uint8_t byte)
{
    edl_job_secret_init(s);
    memset(s->key, byte, 32);
    s->len = 32;
}

void harness_ps_open(harness_ps *k, int n, const edl_ps_server_options *extra)
{
    memset(k, 0, sizeof *k);
    harness_ps_secret(&k->secret, 0x5a);
    k->n = n;
    for (int i = 0; i < n; i++) {
        edl_ps_server_options o = extra ? *extra : (edl_ps_server_options){0};
        char why[256];
        o.secret = &k->secret;
        o.threads = o.threads ? o.threads : 2;
        o.job = "job-a";
        if (edl_ps_server_open(&o, &k->srv[i], why, sizeof why) != 0)
            fail_msg("server %d: %s", i, why);
        assert_int_equal(edl_ps_server_start(k->srv[i]), 0);
        snprintf(k->eps[i], sizeof k->eps[i], "127.0.0.1:%d", edl_ps_server_port(k->srv[i]));
        k->ep[i] = k->eps[i];
    }
}

void harness_ps_close(harness_ps *k)
{
    for (int i = 0; i < k->n; i++)
        edl_ps_server_close(k->srv[i]);
    k->n = 0;
}

edl_ps_client *harness_ps_client(const harness_ps *k, int timeout_ms)
{
    edl_ps_client_options o = {.endpoints = k->ep, .n_servers = k->n, .job = "job-a",
                               .secret = &k->secret, .timeout_ms = timeout_ms};
    edl_ps_client *c = NULL;
    char why[512];
    if (edl_ps_client_open(&o, &c, why, sizeof why) != 0)
        fail_msg("client: %s", why);
    return c;
}

void harness_ps_ok(edl_ps_client *c, int rc)
{
    if (rc != 0)
        fail_msg("%s (%s)", edl_ps_client_errmsg(c), edl_err_name(rc));
}
