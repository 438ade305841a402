/* harness_s3.c: an S3-protocol server for the storage and checkpoint tests.
 *
 * By default a real s3rver (npm package, installed into tests/.s3rver by scripts/install-deps)
 * is started on a free loopback port with a fresh data directory and the bucket "edl-test",
 * and killed with the test (PR_SET_PDEATHSIG, so not even a crashed test leaves it behind).
 * With EDL_TEST_S3_ENDPOINT set, no server is started and the tests use that endpoint instead
 * (MinIO, AWS): bucket EDL_TEST_S3_BUCKET (default edl-test, must exist), credentials and
 * region from the usual AWS_* variables. Each test writes under a prefix of its own. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "edl/proc.h"
#include "harness.h"

#define S3RVER_START_TIMEOUT_MS 20000

struct harness_s3 {
    pid_t pid;         /* 0: an external endpoint */
    int port;
    char dir[256];
    char endpoint[512];
    char bucket[128];
    bool external;
    unsigned seq;
};

bool harness_s3_available(void)
{
    if (getenv("EDL_TEST_S3_ENDPOINT") && getenv("EDL_TEST_S3_ENDPOINT")[0])
        return true;
    return EDL_NODE_BIN[0] && access(EDL_S3RVER_JS, R_OK) == 0;
}

/* 200 from an anonymous GET of the bucket: s3rver listens and the bucket exists. */
static bool s3rver_ready(int port)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/edl-test?list-type=2&max-keys=1", port);
    CURL *h = curl_easy_init();
    if (!h)
        return false;
    FILE *null = fopen("/dev/null", "w");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, null);
    long status = 0;
    bool ok = curl_easy_perform(h) == CURLE_OK &&
              curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK && status == 200;
    curl_easy_cleanup(h);
    if (null)
        fclose(null);
    return ok;
}

static pid_t spawn_s3rver(harness_s3 *h)
{
    char port[16], data[300], log[300];
    snprintf(port, sizeof port, "%d", h->port);
    snprintf(data, sizeof data, "%s/data", h->dir);
    snprintf(log, sizeof log, "%s/s3rver.log", h->dir);
    mkdir(data, 0700);
    char *argv[] = {(char *)EDL_NODE_BIN, (char *)EDL_S3RVER_JS, "-d", data, "-a", "127.0.0.1",
                    "-p", port, "--service-endpoint", "localhost", "--configure-bucket",
                    "edl-test", NULL};
    edl_spawn_opts so = {.argv = argv, .log_path = log};
    char err[512];
    pid_t pid = -1;
    if (edl_spawn(&so, &pid, err, sizeof err) != 0)
        fprintf(stderr, "harness_s3: %s\n", err);
    return pid;
}

static void print_log(const harness_s3 *h)
{
    char path[300], buf[2048];
    snprintf(path, sizeof path, "%s/s3rver.log", h->dir);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    fprintf(stderr, "harness: s3rver log %s:\n%s\n", path, buf);
}

static void stop_child(harness_s3 *h)
{
    if (h->pid > 0) {
        kill(h->pid, SIGKILL);
        while (waitpid(h->pid, NULL, 0) < 0 && errno == EINTR) {
        }
    }
    h->pid = 0;
}

harness_s3 *harness_s3_open(void)
{
    harness_s3 *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    const char *ext = getenv("EDL_TEST_S3_ENDPOINT");
    if (ext && ext[0]) {
        const char *b = getenv("EDL_TEST_S3_BUCKET");
        h->external = true;
        snprintf(h->endpoint, sizeof h->endpoint, "%s", ext);
        snprintf(h->bucket, sizeof h->bucket, "%s", b && b[0] ? b : "edl-test");
        return h;
    }
    snprintf(h->bucket, sizeof h->bucket, "edl-test");
    const char *tmp = getenv("TMPDIR");
    snprintf(h->dir, sizeof h->dir, "%s/edl-s3rver-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(h->dir)) {
        fprintf(stderr, "harness: mkdtemp %s: %s\n", h->dir, strerror(errno));
        free(h);
        return NULL;
    }
    for (int attempt = 0; attempt < 3; attempt++) {
        h->port = harness_free_port();
        h->pid = spawn_s3rver(h);
        if (h->pid < 0)
            break;
        int64_t deadline = harness_now_ms() + S3RVER_START_TIMEOUT_MS;
        while (harness_now_ms() < deadline) {
            if (waitpid(h->pid, NULL, WNOHANG) == h->pid) {
                h->pid = 0; /* exited: perhaps the port was taken; try another */
                break;
            }
            if (s3rver_ready(h->port)) {
                snprintf(h->endpoint, sizeof h->endpoint, "http://127.0.0.1:%d", h->port);
                return h;
            }
            harness_sleep_ms(50);
        }
        stop_child(h);
    }
    fprintf(stderr, "harness: s3rver (%s %s) did not come up\n", EDL_NODE_BIN, EDL_S3RVER_JS);
    print_log(h);
    harness_rmtree(h->dir);
    free(h);
    return NULL;
}

const char *harness_s3_endpoint(const harness_s3 *h)
{
    return h->endpoint;
}

int harness_s3_port(const harness_s3 *h)
{
    return h->port;
}

bool harness_s3_external(const harness_s3 *h)
{
    return h->external;
}

const char *harness_s3_uri(harness_s3 *h, const char *name, char *out, size_t outlen)
{
    snprintf(out, outlen, "s3://%s/%s-%ld-%u", h->bucket, name, (long)getpid(), ++h->seq);
    return out;
}

void harness_s3_config(const harness_s3 *h, edl_storage_config *cfg, const char *uri)
{
    edl_storage_config_init(cfg);
    cfg->uri = uri;
    cfg->endpoint = h->endpoint;
    cfg->max_retries = 2;
    cfg->retry_base_ms = 50;
    cfg->connect_timeout_ms = 1000;
    cfg->timeout_ms = 60000;
    if (!h->external) { /* s3rver's one account; AWS_* from the environment otherwise */
        cfg->access_key_id = "S3RVER";
        cfg->secret_access_key = "S3RVER";
        cfg->region = "us-east-1";
    }
}

void harness_s3_close(harness_s3 *h)
{
    if (!h)
        return;
    stop_child(h);
    if (h->dir[0])
        harness_rmtree(h->dir);
    free(h);
}
