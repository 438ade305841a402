/* test_harness.c: the test proxy, the fake HTTP server and the wait for a condition do what the
 * other tests rely on. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "harness.h"

/* ---- harness_wait_until ------------------------------------------------------------------ */

static bool past(void *arg)
{
    return harness_now_ms() >= *(int64_t *)arg;
}

/* It returns as soon as the condition holds, not at the timeout; false when it never holds. */
static void test_wait_until_returns_when_the_condition_holds(void **state)
{
    (void)state;
    int64_t t0 = harness_now_ms(), at = t0 + 150;
    assert_true(harness_wait_until(past, &at, 20000));
    int64_t took = harness_now_ms() - t0;
    assert_true(took >= 150 && took < 2000);
    at = INT64_MAX;
    t0 = harness_now_ms();
    assert_false(harness_wait_until(past, &at, 200));
    assert_true(harness_now_ms() - t0 >= 200);
    int calls = 0;
    assert_true(HARNESS_WAIT_UNTIL(++calls == 3, 20000));
    assert_int_equal(calls, 3);
}

/* ---- a tiny echo server: one thread, poll-based ---------------------------------------- */

#define ECHO_MAX_CONNS 32

typedef struct echo_server {
    int listen_fd;
    int port;
    int stop_pipe[2];
    int conns[ECHO_MAX_CONNS];
    int nconns;
    int accepted; /* written by the thread, read after a round trip has proved it */
    pthread_t thread;
} echo_server;

static void echo_service(echo_server *e, const struct pollfd *fds)
{
    int kept = 0;
    for (int k = 0; k < e->nconns; k++) {
        char buf[65536];
        bool alive = true;
        if (fds[2 + k].revents) {
            ssize_t n = recv(e->conns[k], buf, sizeof buf, 0);
            /* Blocking send: the tests read everything they cause to be sent. */
            alive = n > 0 && send(e->conns[k], buf, (size_t)n, MSG_NOSIGNAL) == n;
        }
        if (alive)
            e->conns[kept++] = e->conns[k];
        else
            close(e->conns[k]);
    }
    e->nconns = kept;
}

static void *echo_main(void *arg)
{
    echo_server *e = arg;
    for (;;) {
        struct pollfd fds[2 + ECHO_MAX_CONNS] = {{.fd = e->stop_pipe[0], .events = POLLIN},
                                                 {.fd = e->listen_fd, .events = POLLIN}};
        for (int k = 0; k < e->nconns; k++)
            fds[2 + k] = (struct pollfd){.fd = e->conns[k], .events = POLLIN};
        if (poll(fds, (nfds_t)(2 + e->nconns), -1) < 0)
            continue;
        if (fds[0].revents)
            break;
        echo_service(e, fds);
        if ((fds[1].revents & POLLIN) && e->nconns < ECHO_MAX_CONNS) {
            int fd = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                e->conns[e->nconns++] = fd;
                __atomic_add_fetch(&e->accepted, 1, __ATOMIC_SEQ_CST);
            }
        }
    }
    for (int k = 0; k < e->nconns; k++)
        close(e->conns[k]);
    return NULL;
}

static echo_server *echo_start(void)
{
    echo_server *e = calloc(1, sizeof *e);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    assert_non_null(e);
    e->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(e->listen_fd >= 0);
    assert_int_equal(bind(e->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(e->listen_fd, 16), 0);
    assert_int_equal(getsockname(e->listen_fd, (struct sockaddr *)&a, &alen), 0);
    e->port = ntohs(a.sin_port);
    assert_int_equal(pipe2(e->stop_pipe, O_CLOEXEC), 0);
    assert_int_equal(pthread_create(&e->thread, NULL, echo_main, e), 0);
    return e;
}

static int echo_accepted(echo_server *e)
{
    return __atomic_load_n(&e->accepted, __ATOMIC_SEQ_CST);
}

static void echo_stop(echo_server *e)
{
    assert_int_equal(write(e->stop_pipe[1], "s", 1), 1);
    pthread_join(e->thread, NULL);
    close(e->listen_fd);
    close(e->stop_pipe[0]);
    close(e->stop_pipe[1]);
    free(e);
}

/* ---- socket helpers -------------------------------------------------------------------- */

static int connect_port(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_str(int fd, const char *s)
{
    assert_int_equal(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s));
}

/* Read exactly len bytes within timeout_ms; returns how many arrived (less on EOF/timeout).
 * *eof is set when the peer closed (EOF or reset). */
static size_t recv_for(int fd, char *buf, size_t len, int timeout_ms, bool *eof)
{
    size_t got = 0;
    int64_t end = harness_now_ms() + timeout_ms;
    if (eof)
        *eof = false;
    while (got < len) {
        int left = (int)(end - harness_now_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t n = recv(fd, buf + got, len - got, 0);
        if (n <= 0) {
            if (eof)
                *eof = true;
            break;
        }
        got += (size_t)n;
    }
    return got;
}

/* CPU time of the whole process: a busy-looping harness thread would show up here. */
static int64_t cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void assert_echo(int fd, const char *s)
{
    char buf[256] = {0};
    send_str(fd, s);
    assert_int_equal(recv_for(fd, buf, strlen(s), 3000, NULL), strlen(s));
    assert_string_equal(buf, s);
}

/* ---- proxy tests ----------------------------------------------------------------------- */

static void test_proxy_forwards_both_ways(void **state)
{
    (void)state;
    echo_server *e = echo_start();
    harness_proxy *p = harness_proxy_open(e->port);
    assert_non_null(p);
    assert_int_not_equal(harness_proxy_port(p), e->port);
    int fd = connect_port(harness_proxy_port(p));
    assert_echo(fd, "hello");
    assert_echo(fd, "again");

    /* 1 MiB through in both directions at once exercises the flow control of the buffers. */
    size_t total = 1 << 20, sent = 0, got = 0;
    char *out = malloc(total), *in = malloc(total);
    assert_non_null(out);
    assert_non_null(in);
    for (size_t k = 0; k < total; k++)
        out[k] = (char)(k * 7 + 3);
    assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
    for (int64_t end = harness_now_ms() + 10000; got < total && harness_now_ms() < end;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN | (sent < total ? POLLOUT : 0)};
        assert_true(poll(&pf, 1, 1000) >= 0);
        if ((pf.revents & POLLOUT) && sent < total) {
            ssize_t n = send(fd, out + sent, total - sent, MSG_NOSIGNAL);
            if (n > 0)
                sent += (size_t)n;
        }
        if (pf.revents & POLLIN) {
            ssize_t n = recv(fd, in + got, total - got, 0);
            assert_true(n > 0 || errno == EAGAIN);
            if (n > 0)
                got += (size_t)n;
        }
    }
    assert_int_equal(got, total);
    assert_memory_equal(in, out, total);
    free(out);
    free(in);

    /* A half-close travels through: the echo answers, then its EOF comes back. */
    char buf[8] = {0};
    bool eof = false;
    assert_int_equal(fcntl(fd, F_SETFL, 0), 0);
    send_str(fd, "bye");
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    assert_int_equal(recv_for(fd, buf, sizeof buf, 3000, &eof), 3);
    assert_string_equal(buf, "bye");
    assert_true(eof);
    close(fd);
    assert_int_equal(harness_proxy_accepted(p), 1);
    harness_proxy_close(p);
    echo_stop(e);
}

static void test_proxy_freeze_holds_bytes_until_thaw(void **state)
{
    (void)state;
    echo_server *e = echo_start();
    harness_proxy *p = harness_proxy_open(e->port);
    char buf[16] = {0};
    int old = connect_port(harness_proxy_port(p));
    assert_echo(old, "a");

    harness_proxy_freeze(p, true);
    send_str(old, "b");
    int fresh = connect_port(harness_proxy_port(p)); /* accepted, but not connected onward */
    send_str(fresh, "c");
    int64_t cpu0 = cpu_ms();
    assert_int_equal(recv_for(old, buf, 1, 300, NULL), 0);
    assert_true(cpu_ms() - cpu0 < 100); /* frozen means asleep, not spinning */
    assert_int_equal(recv_for(fresh, buf, 1, 50, NULL), 0);
    assert_int_equal(echo_accepted(e), 1);

    harness_proxy_freeze(p, false);
    assert_int_equal(recv_for(old, buf, 1, 3000, NULL), 1);
    assert_int_equal(buf[0], 'b');
    assert_int_equal(recv_for(fresh, buf, 1, 3000, NULL), 1);
    assert_int_equal(buf[0], 'c');
    assert_int_equal(echo_accepted(e), 2);
    close(old);
    close(fresh);
    harness_proxy_close(p);
    echo_stop(e);
}

static void test_proxy_drop_closes_every_connection(void **state)
{
    (void)state;
    echo_server *e = echo_start();
    harness_proxy *p = harness_proxy_open(e->port);
    char buf[16];
    bool eof = false;
    int a = connect_port(harness_proxy_port(p)), b = connect_port(harness_proxy_port(p));
    assert_echo(a, "x");
    assert_echo(b, "y");
    harness_proxy_freeze(p, true); /* drop must also close frozen connections */
    harness_proxy_drop(p);
    harness_proxy_freeze(p, false);
    assert_int_equal(recv_for(a, buf, 1, 1000, &eof), 0);
    assert_true(eof);
    assert_int_equal(recv_for(b, buf, 1, 1000, &eof), 0);
    assert_true(eof);
    int c = connect_port(harness_proxy_port(p)); /* the proxy itself keeps serving */
    assert_echo(c, "z");
    close(a);
    close(b);
    close(c);
    harness_proxy_close(p);
    echo_stop(e);
}

static void test_proxy_set_target_moves_new_connections_only(void **state)
{
    (void)state;
    echo_server *e1 = echo_start(), *e2 = echo_start();
    harness_proxy *p = harness_proxy_open(e1->port);
    int old = connect_port(harness_proxy_port(p));
    assert_echo(old, "1");
    harness_proxy_set_target(p, e2->port);
    int fresh = connect_port(harness_proxy_port(p));
    assert_echo(fresh, "2");
    assert_echo(old, "3");
    assert_int_equal(echo_accepted(e1), 1);
    assert_int_equal(echo_accepted(e2), 1);
    close(old);
    close(fresh);
    harness_proxy_close(p);
    echo_stop(e1);
    echo_stop(e2);
}

static void test_proxy_closes_client_when_target_refuses(void **state)
{
    (void)state;
    echo_server *e = echo_start();
    int dead_port = e->port;
    echo_stop(e); /* nothing listens there now */
    harness_proxy *p = harness_proxy_open(dead_port);
    char buf[4];
    bool eof = false;
    int fd = connect_port(harness_proxy_port(p));
    assert_int_equal(recv_for(fd, buf, 1, 2000, &eof), 0);
    assert_true(eof);
    close(fd);
    /* Stopping with a connection still open and frozen must not hang. */
    int held = connect_port(harness_proxy_port(p));
    harness_proxy_freeze(p, true);
    harness_proxy_close(p);
    close(held);
}

/* ---- fake HTTP tests ------------------------------------------------------------------- */

typedef struct fetch {
    CURLcode rc;
    long status;
    char body[4096]; /* the first bytes */
    size_t len;      /* all bytes received */
    size_t abort_after;
    long connects;
    curl_off_t content_length;
} fetch;

static size_t fetch_write(char *p, size_t size, size_t n, void *ud)
{
    fetch *f = ud;
    size_t total = size * n;
    if (f->len < sizeof f->body - 1) {
        size_t take = total < sizeof f->body - 1 - f->len ? total : sizeof f->body - 1 - f->len;
        memcpy(f->body + f->len, p, take);
        f->body[f->len + take] = '\0';
    }
    f->len += total;
    if (f->abort_after && f->len >= f->abort_after)
        return 0; /* a client's response-size cap */
    return total;
}

/* One request on handle c (reused for keep-alive); POST when post_body is not NULL. */
static void do_fetch(CURL *c, const char *url, const char *post_body, long timeout_ms, fetch *f)
{
    memset(f, 0, sizeof *f);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, fetch_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
    if (post_body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, post_body);
    else
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    f->rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &f->status);
    curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &f->connects);
    curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &f->content_length);
}

static void url_for(const harness_http *h, const char *path, char *out, size_t len)
{
    snprintf(out, len, "%s%s", harness_http_url(h), path);
}

static void test_http_normal_reply_keeps_connection_alive(void **state)
{
    (void)state;
    harness_http *h = harness_http_open();
    CURL *c = curl_easy_init();
    char url[128], path[64], body[128];
    fetch f;
    assert_non_null(h);
    assert_true(strncmp(harness_http_url(h), "http://127.0.0.1:", 17) == 0);
    assert_int_equal(atoi(harness_http_url(h) + 17), harness_http_port(h));
    harness_http_reply(h, 200, "{\"count\":\"1\"}", 13, HTTP_NORMAL);
    url_for(h, "/v3/kv/range", url, sizeof url);
    do_fetch(c, url, "{\"key\":\"Zm9v\"}", 2000, &f);
    assert_int_equal(f.rc, CURLE_OK);
    assert_int_equal(f.status, 200);
    assert_string_equal(f.body, "{\"count\":\"1\"}");
    assert_int_equal(f.content_length, 13);
    assert_int_equal(harness_http_last_request(h, path, sizeof path, body, sizeof body), 1);
    assert_string_equal(path, "/v3/kv/range");
    assert_string_equal(body, "{\"key\":\"Zm9v\"}");

    url_for(h, "/v3/kv/put?x=1", url, sizeof url);
    do_fetch(c, url, "{}", 2000, &f);
    assert_int_equal(f.rc, CURLE_OK);
    assert_int_equal(f.connects, 0); /* the same connection served the second request */
    assert_int_equal(harness_http_requests(h), 2);
    harness_http_last_request(h, path, sizeof path, NULL, 0);
    assert_string_equal(path, "/v3/kv/put?x=1");
    curl_easy_cleanup(c);
    harness_http_close(h);
}

static void test_http_reply_per_path(void **state)
{
    (void)state;
    harness_http *h = harness_http_open();
    CURL *c = curl_easy_init();
    char url[128];
    fetch f;
    harness_http_reply_path(h, "/v3/lease/grant", 200, "{\"ID\":\"7\",\"TTL\":\"5\"}", 20,
                            HTTP_NORMAL);
    harness_http_reply_path(h, "/v3/kv/put", 401, "{\"message\":\"no\"}", 16, HTTP_NORMAL);
    url_for(h, "/v3/lease/grant", url, sizeof url);
    do_fetch(c, url, "{\"TTL\":5}", 2000, &f);
    assert_int_equal(f.status, 200);
    assert_string_equal(f.body, "{\"ID\":\"7\",\"TTL\":\"5\"}");
    url_for(h, "/v3/kv/put?q", url, sizeof url); /* the query does not take part */
    do_fetch(c, url, "{}", 2000, &f);
    assert_int_equal(f.status, 401);
    assert_string_equal(f.body, "{\"message\":\"no\"}");
    url_for(h, "/v3/kv/range", url, sizeof url);
    do_fetch(c, url, "{}", 2000, &f);
    assert_int_equal(f.status, 200);
    assert_string_equal(f.body, "{}"); /* the default reply */
    curl_easy_cleanup(c);
    harness_http_close(h);
}

static void test_http_truncated_reply_is_partial(void **state)
{
    (void)state;
    harness_http *h = harness_http_open();
    CURL *c = curl_easy_init();
    fetch f;
    harness_http_reply(h, 200, "{\"kvs\":[{\"key\"", 14, HTTP_TRUNCATED);
    do_fetch(c, harness_http_url(h), "{}", 2000, &f);
    assert_int_equal(f.rc, CURLE_PARTIAL_FILE);
    assert_int_equal(f.len, 14);
    assert_int_equal(f.content_length, 114);
    curl_easy_cleanup(c);
    harness_http_close(h);
}

static void test_http_chunked_reply_and_open_stream(void **state)
{
    (void)state;
    harness_http *h = harness_http_open();
    CURL *c = curl_easy_init();
    const char *lines = "{\"result\":{\"created\":true}}\n{\"result\":{\"events\":[]}}\n";
    fetch f;
    harness_http_reply(h, 200, lines, strlen(lines), HTTP_CHUNKED);
    do_fetch(c, harness_http_url(h), "{}", 2000, &f);
    assert_int_equal(f.rc, CURLE_OK);
    assert_string_equal(f.body, lines);
    assert_int_equal(f.content_length, -1); /* no Content-Length: it was chunked */
    do_fetch(c, harness_http_url(h), "{}", 2000, &f);
    assert_int_equal(f.connects, 0);

    harness_http_reply(h, 200, lines, strlen(lines), HTTP_CHUNKED_HANG);
    int64_t t0 = harness_now_ms();
    do_fetch(c, harness_http_url(h), "{}", 400, &f);
    assert_int_equal(f.rc, CURLE_OPERATION_TIMEDOUT);
    assert_true(harness_now_ms() - t0 >= 350);
    assert_string_equal(f.body, lines); /* the lines came before the stream stalled */
    curl_easy_cleanup(c);
    harness_http_close(h);
}

static void test_http_close_without_reply_and_hang(void **state)
{
    (void)state;
    harness_http *h = harness_http_open();
    CURL *c = curl_easy_init();
    fetch f;
    harness_http_reply(h, 200, "", 0, HTTP_CLOSE_NO_REPLY);
    do_fetch(c, harness_http_url(h), "{}", 2000, &f);
    assert_int_equal(f.rc, CURLE_GOT_NOTHING);
    assert_int_equal(harness_http_requests(h), 1); /* the request was read before closing */

    harness_http_reply(h, 200, "{}", 2, HTTP_HANG);
    int64_t t0 = harness_now_ms(), cpu0 = cpu_ms();
    do_fetch(c, harness_http_url(h), "{}", 300, &f);
    assert_int_equal(f.rc, CURLE_OPERATION_TIMEDOUT);
    assert_int_equal(f.len, 0);
    assert_true(harness_now_ms() - t0 >= 250);
    assert_true(cpu_ms() - cpu0 < 100);

    /* stop must not wait for a client that keeps a hanging request open. */
    int fd = connect_port(harness_http_port(h));
    send_str(fd, "POST /v3/watch HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    for (int64_t end = harness_now_ms() + 2000;
         harness_http_requests(h) < 3 && harness_now_ms() < end;)
        harness_sleep_ms(5);
    assert_int_equal(harness_http_requests(h), 3);
    t0 = harness_now_ms();
    harness_http_close(h);
    assert_true(harness_now_ms() - t0 < 1000);
    close(fd);
    curl_easy_cleanup(c);
}

static void test_http_huge_reply_streams_until_limit_or_client_leaves(void **state)
{
    (void)state;
    harness_http *h = harness_http_open();
    CURL *c = curl_easy_init();
    fetch f;
    harness_http_reply(h, 200, "0123456789", 10, HTTP_HUGE);
    harness_http_huge_limit(h, 1000005);
    do_fetch(c, harness_http_url(h), "{}", 5000, &f);
    assert_int_equal(f.rc, CURLE_OK);
    assert_int_equal(f.len, 1000005);
    assert_memory_equal(f.body, "01234567890123456789", 20);

    harness_http_huge_limit(h, 0); /* for ever: the client's cap must end it */
    memset(&f, 0, sizeof f);
    f.abort_after = 4 << 20;
    curl_easy_setopt(c, CURLOPT_URL, harness_http_url(h));
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &f);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 20000L);
    f.rc = curl_easy_perform(c);
    assert_int_equal(f.rc, CURLE_WRITE_ERROR);
    assert_true(f.len >= (size_t)4 << 20);
    curl_easy_cleanup(c);
    harness_http_close(h);
}

static void test_http_pipelined_requests_on_one_connection(void **state)
{
    (void)state;
    harness_http *h = harness_http_open();
    char buf[512] = {0}, path[64];
    const char *req = "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\none"
                      "POST /b HTTP/1.1\r\ncontent-length: 3\r\nConnection: close\r\n\r\ntwo";
    bool eof = false;
    harness_http_reply(h, 200, "ok", 2, HTTP_NORMAL);
    int fd = connect_port(harness_http_port(h));
    send_str(fd, req);
    size_t n = recv_for(fd, buf, sizeof buf - 1, 2000, &eof);
    assert_true(eof); /* "Connection: close" on the second request */
    buf[n] = '\0';
    assert_non_null(strstr(buf, "HTTP/1.1 200 OK"));
    assert_non_null(strstr(strstr(buf, "ok") + 2, "HTTP/1.1 200 OK"));
    assert_int_equal(harness_http_last_request(h, path, sizeof path, buf, sizeof buf), 2);
    assert_string_equal(path, "/b");
    assert_string_equal(buf, "two");
    close(fd);
    harness_http_close(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_until_returns_when_the_condition_holds),
        cmocka_unit_test(test_proxy_forwards_both_ways),
        cmocka_unit_test(test_proxy_freeze_holds_bytes_until_thaw),
        cmocka_unit_test(test_proxy_drop_closes_every_connection),
        cmocka_unit_test(test_proxy_set_target_moves_new_connections_only),
        cmocka_unit_test(test_proxy_closes_client_when_target_refuses),
        cmocka_unit_test(test_http_normal_reply_keeps_connection_alive),
        cmocka_unit_test(test_http_reply_per_path),
        cmocka_unit_test(test_http_truncated_reply_is_partial),
        cmocka_unit_test(test_http_chunked_reply_and_open_stream),
        cmocka_unit_test(test_http_close_without_reply_and_hang),
        cmocka_unit_test(test_http_huge_reply_streams_until_limit_or_client_leaves),
        cmocka_unit_test(test_http_pipelined_requests_on_one_connection),
    };
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return failed;
}
