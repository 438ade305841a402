/* test_core.c: libedlcore's plumbing: the error table, the byte buffer, the strict JSON reader,
 * the thread-to-loop queue, the event loop, works run off a loop, the HTTP clients' shared policy, the source
 * keys of per-source bounds, child processes (edl_spawn, edl_env_build) and the /metrics
 * server with its Prometheus writer. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edl/common.h"
#include "edl/http.h"
#include "edl/json.h"
#include "edl/loop.h"
#include "edl/metrics.h"
#include "edl/net.h"
#include "edl/proc.h"
#include "edl/queue.h"
#include "edl/work.h"
#include "harness.h"

/* ---- errors --------------------------------------------------------------------------------- */

static void test_every_error_code_has_a_name_and_a_text(void **state)
{
    (void)state;
    int n = 0;
#define CHECK_CODE(name, value, text)                                                             \
    assert_int_equal(EDL_##name, value);                                                        \
    assert_string_equal(edl_err_name(EDL_##name), "EDL_" #name);                                \
    assert_string_equal(edl_strerror(EDL_##name), text);                                        \
    n++;
    EDL_ERRNO_MAP(CHECK_CODE)
#undef CHECK_CODE
    assert_int_equal(n, 19);
    assert_string_equal(edl_err_name(0), "EDL_OK");
    assert_string_equal(edl_strerror(0), "success");
    assert_string_equal(edl_err_name(-99), "EDL_E?");
    assert_string_equal(edl_strerror(-99), "unknown error");
    assert_string_equal(edl_err_name(EDL_EPEER), "EDL_EPEER");
    assert_string_equal(edl_err_name(EDL_ENOTSUP), "EDL_ENOTSUP");
    assert_string_equal(edl_err_name(EDL_EMOVED), "EDL_EMOVED");
    assert_string_equal(edl_strerror(EDL_EBUSY), "busy for a moment: try again");
}

static void test_byte_buffer_grows_to_its_bound_and_no_further(void **state)
{
    (void)state;
    edl_bytebuf b = {.max = 10000};
    char chunk[3000];
    memset(chunk, 'x', sizeof chunk);
    for (int i = 0; i < 3; i++)
        assert_int_equal(edl_bytebuf_append(&b, chunk, sizeof chunk), 0);
    assert_int_equal(b.len, 9000);
    assert_int_equal(b.data[9000], '\0'); /* always NUL-terminated */
    assert_true(b.cap <= 10001);           /* never past the bound, doubling or not */
    assert_int_equal(edl_bytebuf_append(&b, chunk, sizeof chunk), EDL_ETOOBIG);
    assert_true(b.overflow);
    assert_int_equal(b.len, 9000); /* nothing appended */
    assert_int_equal(edl_bytebuf_append(&b, chunk, 1000), 0); /* exactly up to the bound */
    assert_int_equal(b.len, 10000);
    edl_bytebuf_clear(&b);
    assert_null(b.data);
    assert_int_equal(b.max, 10000);
    assert_int_equal(edl_bytebuf_append(&b, "", 0), 0); /* empty, but a buffer */
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    edl_bytebuf_clear(&b);
}

/* ---- the JSON reader ------------------------------------------------------------------------ */

static void test_json_reader_checks_types_ranges_and_keeps_the_first_error(void **state)
{
    (void)state;
    const char *doc = "{\"n\":7,\"big\":1e300,\"f\":1.5,\"s\":\"hello\",\"b\":true,\"e\":\"two\","
                      "\"lease\":\"7a4d8b3e1234abcd\",\"arr\":[1,2,3],\"o\":{},\"nul\":null}";
    int rc;
    char err[256];
    cJSON *o = edl_json_parse_object(doc, strlen(doc), 4096, "doc", err, sizeof err, &rc);
    assert_non_null(o);
    static const char *const names[] = {"one", "two"};
    edl_json_reader r = {o, "doc", err, sizeof err, 0};
    int n = -1, e = -1, missing = 42;
    int64_t lease = 0;
    bool b = false;
    char *s = NULL;
    assert_true(edl_json_int(&r, "n", 0, 10, &n));
    assert_int_equal(n, 7);
    assert_false(edl_json_int(&r, "absent", 0, 10, &missing)); /* absent: the default stays */
    assert_false(edl_json_int(&r, "nul", 0, 10, &missing));    /* null reads as absent */
    assert_int_equal(missing, 42);
    assert_true(edl_json_bool(&r, "b", &b) && b);
    assert_true(edl_json_str(&r, "s", 5, &s));
    assert_string_equal(s, "hello");
    assert_true(edl_json_enum(&r, "e", names, 2, &e));
    assert_int_equal(e, 1);
    assert_true(edl_json_hex64(&r, "lease", &lease));
    assert_true(lease == INT64_C(0x7a4d8b3e1234abcd)); /* all 64 bits */
    assert_non_null(edl_json_array(&r, "arr", 3));
    assert_non_null(edl_json_object(&r, "o"));
    assert_int_equal(r.rc, 0);
    /* problems: each has its code and message; the first one stays */
    edl_json_reader t = {o, "doc", err, sizeof err, 0};
    assert_false(edl_json_int(&t, "f", 0, 10, &n));
    assert_int_equal(t.rc, EDL_EPROTO);
    assert_string_equal(err, "doc: field \"f\" must be an integer");
    assert_false(edl_json_int(&t, "n", 0, 10, &n)); /* after an error, nothing more is read */
    assert_string_equal(err, "doc: field \"f\" must be an integer");
    t = (edl_json_reader){o, "doc", err, sizeof err, 0};
    assert_false(edl_json_i64(&t, "big", 0, 100, &lease));
    assert_int_equal(t.rc, EDL_ECONFIG);
    assert_non_null(strstr(err, "outside 0..100"));
    t = (edl_json_reader){o, "doc", err, sizeof err, 0};
    assert_false(edl_json_str(&t, "s", 4, &s));
    assert_int_equal(t.rc, EDL_ETOOBIG);
    assert_string_equal(s, "hello"); /* untouched */
    t = (edl_json_reader){o, "doc", err, sizeof err, 0};
    assert_false(edl_json_enum(&t, "s", names, 2, &e));
    assert_int_equal(t.rc, EDL_ECONFIG);
    assert_non_null(strstr(err, "unknown value \"hello\""));
    t = (edl_json_reader){o, "doc", err, sizeof err, 0};
    assert_false(edl_json_hex64(&t, "n", &lease));
    assert_non_null(strstr(err, "lease ID"));
    t = (edl_json_reader){o, "doc", err, sizeof err, 0};
    assert_null(edl_json_array(&t, "arr", 2));
    assert_int_equal(t.rc, EDL_ETOOBIG);
    t = (edl_json_reader){o, "doc", err, sizeof err, 0};
    assert_false(edl_json_require(&t, "absent"));
    assert_string_equal(err, "doc: field \"absent\" is required");
    free(s);
    cJSON_Delete(o);
    /* documents that are not one object */
    static const struct {
        const char *text;
        size_t max;
        int rc;
        const char *msg;
    } bad[] = {{"{\"a\":", 100, EDL_EPROTO, "not valid JSON"},
               {"[1]", 100, EDL_EPROTO, "not a JSON object"},
               {"{\"a\":1}", 3, EDL_ETOOBIG, "exceeds the 3-byte limit"},
               /* found by fuzz/fuzz_job_docs: two documents run together read as the first */
               {"{\"a\":1}{\"a\":2}", 100, EDL_EPROTO, "bytes after the JSON object, from byte 7"},
               {"{\"a\":1} x", 100, EDL_EPROTO, "bytes after the JSON object, from byte 8"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_null(edl_json_parse_object(bad[i].text, strlen(bad[i].text), bad[i].max, "doc",
                                          err, sizeof err, &rc));
        assert_int_equal(rc, bad[i].rc);
        assert_non_null(strstr(err, bad[i].msg));
    }
    /* white space after the object is fine (a file written with a final newline) */
    o = edl_json_parse_object("{\"a\":1}\r\n ", 10, 100, "doc", err, sizeof err, &rc);
    assert_non_null(o);
    assert_int_equal(rc, 0);
    cJSON_Delete(o);
}

/* ---- the thread-to-loop queue ------------------------------------------------------------- */

static bool fd_readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

/* cJSON prints 15 significant digits whenever they come within a relative DBL_EPSILON of the
 * number: a teacher's load of 0.1 + 2^-56 read back as 0.1 and a checkpoint's step 2^53 - 1
 * as 2^53 - 2 (its directory name then disagreed). edl_json_print writes every number so it
 * reads back the same, and leaves the tree as it was. */
static void test_json_print_writes_every_number_exactly_and_leaves_the_tree(void **state)
{
    (void)state;
    const double values[] = {0.1 + 0x1p-56, 9007199254740991.0, 4503599627370497.0, 0.1, 3,
                             -2.5e-310, 1e300, 123456789012.345678};
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "v");
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(values[i]));
    cJSON_AddItemToObject(o, "raw", cJSON_CreateRaw("[1,2]"));
    for (int pretty = 0; pretty <= 1; pretty++) {
        char *s = edl_json_print(o, pretty);
        assert_non_null(s);
        cJSON *back = cJSON_Parse(s);
        assert_non_null(back);
        const cJSON *v = cJSON_GetObjectItem(back, "v");
        for (size_t i = 0; i < sizeof values / sizeof values[0]; i++)
            assert_true(cJSON_GetArrayItem(v, (int)i)->valuedouble == values[i]);
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(back, "raw")), 2);
        assert_non_null(strstr(s, "0.1,")); /* 0.1 itself stays short */
        cJSON_Delete(back);
        free(s);
    }
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        const cJSON *n = cJSON_GetArrayItem(arr, (int)i);
        assert_true(cJSON_IsNumber(n) && n->valuedouble == values[i] && !n->valuestring);
    }
    assert_true(cJSON_IsRaw(cJSON_GetObjectItem(o, "raw")));
    assert_null(edl_json_print(NULL, false));
    cJSON_Delete(o);
}

static void *push_three(void *arg)
{
    edl_queue *q = arg;
    static int items[3] = {1, 2, 3};
    intptr_t pushed = 0;
    for (int i = 0; i < 3; i++)
        pushed += edl_queue_push(q, &items[i]);
    return (void *)pushed;
}

static void test_queue_keeps_order_bounds_producers_and_its_fd_tells_the_truth(void **state)
{
    (void)state;
    edl_queue *q;
    assert_int_equal(edl_queue_open(2, &q), 0);
    void *item;
    assert_false(fd_readable(edl_queue_fd(q)));
    assert_int_equal(edl_queue_pop(q, &item, 0), EDL_ETIMEDOUT);
    assert_int_equal(edl_queue_pop(q, &item, 30), EDL_ETIMEDOUT);

    /* a producer of three into a queue of two waits for room: back-pressure, nothing lost */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, push_three, q), 0);
    for (int i = 0; i < 100 && edl_queue_len(q) < 2; i++)
        usleep(10000);
    usleep(50000);
    assert_int_equal(edl_queue_len(q), 2); /* the third waits */
    assert_true(fd_readable(edl_queue_fd(q)));
    for (int want = 1; want <= 3; want++) {
        assert_int_equal(edl_queue_pop(q, &item, 2000), 0);
        assert_int_equal(*(int *)item, want);
    }
    void *pushed;
    pthread_join(t, &pushed);
    assert_int_equal((intptr_t)pushed, 3);
    assert_false(fd_readable(edl_queue_fd(q)));

    /* an item put back comes out first and keeps the fd readable */
    int a = 10, b = 11;
    assert_true(edl_queue_push(q, &a));
    assert_true(edl_queue_unpop(q, &b));
    assert_true(fd_readable(edl_queue_fd(q)));
    assert_int_equal(edl_queue_pop(q, &item, 0), 0);
    assert_ptr_equal(item, &b);
    assert_true(fd_readable(edl_queue_fd(q)));
    assert_int_equal(edl_queue_pop(q, &item, 0), 0);
    assert_ptr_equal(item, &a);
    assert_false(fd_readable(edl_queue_fd(q)));

    /* a stopped queue refuses pushes, wakes a waiting producer, and frees what it holds */
    assert_true(edl_queue_push(q, &a));
    assert_true(edl_queue_push(q, &b));
    assert_int_equal(pthread_create(&t, NULL, push_three, q), 0);
    usleep(50000);
    edl_queue_stop(q);
    pthread_join(t, &pushed);
    assert_int_equal((intptr_t)pushed, 0);
    assert_false(edl_queue_push(q, &a));
    edl_queue_close(q, NULL);
}

/* ---- works run off the loop --------------------------------------------------------------- */

typedef struct {
    edl_work w;
    int ms, order, *ran, *done_count, *last_done;
    pthread_t run_thread;
} slow_work;

static void slow_run(edl_work *w)
{
    slow_work *s = (slow_work *)w;
    usleep((useconds_t)s->ms * 1000);
    s->run_thread = pthread_self();
    *s->ran = s->order;
}

static void slow_done(edl_work *w)
{
    slow_work *s = (slow_work *)w;
    assert_false(pthread_equal(s->run_thread, pthread_self())); /* run was on the worker */
    assert_int_equal(*s->last_done + 1, s->order); /* in the order submitted */
    *s->last_done = s->order;
    (*s->done_count)++;
    free(s);
}

static slow_work *slow(int ms, int order, int *ran, int *done_count, int *last_done)
{
    slow_work *s = calloc(1, sizeof *s);
    *s = (slow_work){{slow_run, slow_done}, ms, order, ran, done_count, last_done, 0};
    return s;
}

static void test_works_run_off_the_loop_and_complete_on_it_in_order(void **state)
{
    (void)state;
    edl_worker *wk;
    assert_int_equal(edl_worker_open(&wk), 0);
    int ran = 0, done = 0, last = 0;
    int64_t t0 = edl_monotonic_ms();
    assert_int_equal(edl_worker_submit(wk, &slow(300, 1, &ran, &done, &last)->w), 0);
    assert_int_equal(edl_worker_submit(wk, &slow(0, 2, &ran, &done, &last)->w), 0);
    assert_true(edl_monotonic_ms() - t0 < 100); /* submitting never waits for the work */
    assert_int_equal(edl_worker_pending(wk), 2);
    assert_false(fd_readable(edl_worker_fd(wk)));
    edl_worker_complete(wk); /* nothing finished: nothing done */
    assert_int_equal(done, 0);
    struct pollfd p = {.fd = edl_worker_fd(wk), .events = POLLIN};
    while (done < 2) {
        assert_int_equal(poll(&p, 1, 5000), 1);
        edl_worker_complete(wk);
    }
    assert_int_equal(ran, 2);
    assert_int_equal(edl_worker_pending(wk), 0);
    assert_false(fd_readable(edl_worker_fd(wk)));

    /* close lets the queued works finish and runs their done */
    assert_int_equal(edl_worker_submit(wk, &slow(100, 3, &ran, &done, &last)->w), 0);
    assert_int_equal(edl_worker_submit(wk, &slow(0, 4, &ran, &done, &last)->w), 0);
    edl_worker_close(wk);
    assert_int_equal(done, 4);
    assert_int_equal(last, 4);
}

/* ---- the HTTP clients' shared policy ------------------------------------------------------- */

/* Per-source bounds group connections by edl_addr_key: an IPv4 address, the same address
 * mapped into IPv6 alike, an IPv6 address by its /64, and a connected socket's peer. */
static void test_addr_keys_group_sources_by_ipv4_address_and_ipv6_64(void **state)
{
    (void)state;
    uint8_t a[EDL_ADDR_KEY_BYTES], b[EDL_ADDR_KEY_BYTES], zero[EDL_ADDR_KEY_BYTES] = {0};
    struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = htons(1)};
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_port = htons(2)};
    inet_pton(AF_INET, "10.1.2.3", &v4.sin_addr);
    inet_pton(AF_INET6, "::ffff:10.1.2.3", &v6.sin6_addr);
    edl_addr_key(&v4, a);
    edl_addr_key(&v6, b);
    assert_memory_equal(a, b, sizeof a); /* mapped: the same source */
    v4.sin_port = htons(9);
    edl_addr_key(&v4, b);
    assert_memory_equal(a, b, sizeof a); /* the port does not count */
    inet_pton(AF_INET, "10.1.2.4", &v4.sin_addr);
    edl_addr_key(&v4, b);
    assert_memory_not_equal(a, b, sizeof a);
    inet_pton(AF_INET6, "2001:db8:1:2::1", &v6.sin6_addr);
    edl_addr_key(&v6, a);
    inet_pton(AF_INET6, "2001:db8:1:2:ffff::7", &v6.sin6_addr);
    edl_addr_key(&v6, b);
    assert_memory_equal(a, b, sizeof a); /* one /64 */
    inet_pton(AF_INET6, "2001:db8:1:3::1", &v6.sin6_addr);
    edl_addr_key(&v6, b);
    assert_memory_not_equal(a, b, sizeof a);
    struct sockaddr un = {.sa_family = AF_UNIX};
    edl_addr_key(&un, a);
    assert_memory_equal(a, zero, sizeof a);
    int sv[2]; /* a peer that is not IP: zeros; a loopback TCP peer: 127.0.0.1 */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    edl_peer_key(sv[0], a);
    assert_memory_equal(a, zero, sizeof a);
    close(sv[0]);
    close(sv[1]);
    int port = harness_free_port(), l = socket(AF_INET, SOCK_STREAM, 0);
    int c = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    assert_int_equal(bind(l, (struct sockaddr *)&at, sizeof at), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(connect(c, (struct sockaddr *)&at, sizeof at), 0);
    edl_peer_key(c, a);
    edl_addr_key(&at, b);
    assert_memory_equal(a, b, sizeof a);
    close(c);
    close(l);
}

static void test_http_backoff_doubles_caps_jitters_and_obeys_retry_after(void **state)
{
    (void)state;
    for (int attempt = 0; attempt < 40; attempt++) {
        int64_t full = attempt < 5 ? (int64_t)100 << attempt : 2000;
        if (full > 2000)
            full = 2000;
        bool low = false, high = false;
        for (int i = 0; i < 200; i++) {
            int64_t ms = edl_http_backoff_ms(attempt, 100, 2000, -1);
            assert_true(ms >= full / 2 && ms <= full); /* 50-100 % of the doubled base */
            low |= ms < full * 3 / 4;
            high |= ms >= full * 3 / 4;
        }
        assert_true(low && high); /* jittered, not fixed */
    }
    assert_int_equal(edl_http_backoff_ms(0, 100, 2000, 1000), 1000);  /* the server's word */
    assert_int_equal(edl_http_backoff_ms(3, 100, 2000, 0), 0);
    assert_int_equal(edl_http_backoff_ms(0, 100, 2000, 60000), 2000); /* capped */

    assert_true(edl_http_not_sent(CURLE_COULDNT_CONNECT));
    assert_true(edl_http_not_sent(CURLE_PEER_FAILED_VERIFICATION));
    assert_false(edl_http_not_sent(CURLE_OPERATION_TIMEDOUT)); /* it may have arrived */
    assert_false(edl_http_not_sent(CURLE_RECV_ERROR));
    assert_int_equal(edl_http_code(CURLE_OPERATION_TIMEDOUT), EDL_ETIMEDOUT);
    assert_int_equal(edl_http_code(CURLE_SSL_CACERT_BADFILE), EDL_EAUTH);
    assert_int_equal(edl_http_code(CURLE_ABORTED_BY_CALLBACK), EDL_ECLOSED);
    assert_int_equal(edl_http_code(CURLE_COULDNT_CONNECT), EDL_EUNAVAIL);
}

/* ---- the socket layer (edl/net.h) ---------------------------------------------------------- */

/* A listening socket on 127.0.0.1 that the test never accepts from, and a connection to it. */
static int net_pair(int *l, int *port, int *client, int *server)
{
    assert_int_equal(edl_net_listen("127.0.0.1", 0, l, port), 0);
    assert_true(*port > 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", *port);
    int rc = edl_net_dial(ep, edl_monotonic_ms() + 5000, client);
    if (rc || !server)
        return rc;
    assert_int_equal(edl_net_wait(*l, POLLIN, edl_monotonic_ms() + 5000), 0);
    *server = accept(*l, NULL, NULL);
    assert_true(*server >= 0);
    return 0;
}

/* A peer that never answers: reads, writes and dials end at their deadline, not before and not
 * much after, with EDL_ETIMEDOUT. */
static void test_net_deadline_holds_on_a_peer_that_never_answers(void **state)
{
    (void)state;
    int l, port, c, s;
    assert_int_equal(net_pair(&l, &port, &c, &s), 0);
    char b[16];
    int64_t t0 = edl_monotonic_ms();
    assert_int_equal(edl_net_read_all(c, b, sizeof b, t0 + 200), EDL_ETIMEDOUT);
    int64_t took = edl_monotonic_ms() - t0;
    assert_true(took >= 200 && took < 3000);
    size_t big = 64 << 20; /* more than both sockets' buffers hold: the peer never reads */
    char *p = calloc(1, big);
    assert_non_null(p);
    t0 = edl_monotonic_ms();
    assert_int_equal(edl_net_write_all(c, p, big, t0 + 200), EDL_ETIMEDOUT);
    took = edl_monotonic_ms() - t0;
    assert_true(took >= 200 && took < 3000);
    free(p);
    close(c);
    close(s);
    close(l);

    /* a full accept queue drops the next SYN: the dial waits for an answer until its deadline */
    int q = socket(AF_INET, SOCK_STREAM, 0), held[8], n = 0, rc = 0;
    struct sockaddr_in at = {.sin_family = AF_INET};
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof at;
    assert_int_equal(bind(q, (struct sockaddr *)&at, sizeof at), 0);
    assert_int_equal(listen(q, 0), 0);
    assert_int_equal(getsockname(q, (struct sockaddr *)&at, &al), 0);
    while (n < 8) {
        t0 = edl_monotonic_ms();
        rc = edl_net_dial_addr((struct sockaddr *)&at, al, t0 + 300, &held[n]);
        took = edl_monotonic_ms() - t0;
        if (rc)
            break;
        n++;
    }
    assert_int_equal(rc, EDL_ETIMEDOUT);
    assert_true(took >= 300 && took < 3000);
    while (n--)
        close(held[n]);
    close(q);
}

/* edl_net_unacked: bytes sent on a connection that the peer's kernel holds are acknowledged
 * at once, even though the peer's program never accepts it (what a joining rank reads to tell
 * an acceptor that is merely busy from one whose accept queue dropped the connection). */
static void test_net_unacked_clears_once_the_peers_kernel_holds_the_bytes(void **state)
{
    (void)state;
    int l, port, c;
    assert_int_equal(net_pair(&l, &port, &c, NULL), 0);
    assert_false(edl_net_unacked(c)); /* nothing sent */
    assert_int_equal(edl_net_write_all(c, "hello", 5, edl_monotonic_ms() + 1000), 0);
    int64_t until = edl_monotonic_ms() + 5000;
    while (edl_net_unacked(c) && edl_monotonic_ms() < until)
        usleep(1000);
    assert_false(edl_net_unacked(c));
    close(c);
    close(l);
    assert_false(edl_net_unacked(0)); /* not a socket: no bytes waiting */
}

/* edl_free_port: a port it handed out is not handed out again among the next 63 (the kernel's
 * port-0 bind alone repeated a port within 64 picks in each of three runs of 2,000 on the
 * build machine, 12-59 picks apart), and the last one is free to bind. */
static void test_free_port_does_not_hand_out_a_recent_port_again(void **state)
{
    (void)state;
    enum { PICKS = 2000, WINDOW = 64 };
    static int picked[PICKS];
    for (int i = 0; i < PICKS; i++) {
        picked[i] = edl_free_port("127.0.0.1");
        assert_true(picked[i] > 0);
        for (int k = i - 1; k >= 0 && k > i - WINDOW; k--)
            if (picked[k] == picked[i])
                fail_msg("port %d handed out at pick %d and again at pick %d", picked[i], k, i);
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)picked[PICKS - 1])};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);
}

typedef struct {
    int fd;
    char buf[10];
    atomic_int rc;   /* INT32_MIN while the read runs */
} net_reader;

static void *net_read_thread(void *arg)
{
    net_reader *r = arg;
    atomic_store(&r->rc, edl_net_read_all(r->fd, r->buf, sizeof r->buf,
                                          edl_monotonic_ms() + 10000));
    return NULL;
}

static int unread_bytes(int fd)
{
    int n = -1;
    return ioctl(fd, FIONREAD, &n) == 0 ? n : -1;
}

/* An exact read gathers what the kernel hands over in pieces, returns only when all of it is
 * there, and takes nothing past it. */
static void test_net_exact_read_gathers_short_reads(void **state)
{
    (void)state;
    int l, port, c, s;
    assert_int_equal(net_pair(&l, &port, &c, &s), 0);
    net_reader r = {.fd = c};
    atomic_init(&r.rc, INT32_MIN);
    assert_int_equal(send(s, "012", 3, 0), 3);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, net_read_thread, &r), 0);
    /* the reader has taken the first piece and waits for the rest */
    int64_t end = edl_monotonic_ms() + 5000;
    while (unread_bytes(c) != 0 && edl_monotonic_ms() < end)
        sched_yield();
    assert_int_equal(unread_bytes(c), 0);
    assert_int_equal(atomic_load(&r.rc), INT32_MIN);
    assert_int_equal(send(s, "3456", 4, 0), 4);
    assert_int_equal(send(s, "789abcde", 8, 0), 8);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&r.rc), 0);
    assert_memory_equal(r.buf, "0123456789", 10);
    char rest[5];
    assert_int_equal(edl_net_read_all(c, rest, sizeof rest, edl_monotonic_ms() + 5000), 0);
    assert_memory_equal(rest, "abcde", 5);
    assert_int_equal(edl_net_write_all(s, "xyz", 3, edl_monotonic_ms() + 5000), 0);
    assert_int_equal(edl_net_read_all(c, rest, 3, edl_monotonic_ms() + 5000), 0);
    assert_memory_equal(rest, "xyz", 3);
    close(c);
    close(s);
    close(l);
}

/* A peer that closed: a read short of its length and a write end at once with EDL_EPEER (not
 * at the deadline); a dial to a port nobody listens on is refused at once. */
static void test_net_closed_peer_ends_reads_writes_and_dials_at_once(void **state)
{
    (void)state;
    int l, port, c, s;
    assert_int_equal(net_pair(&l, &port, &c, &s), 0);
    assert_int_equal(send(s, "ab", 2, 0), 2);
    close(s);
    char b[8];
    int64_t t0 = edl_monotonic_ms();
    assert_int_equal(edl_net_read_all(c, b, sizeof b, t0 + 10000), EDL_EPEER);
    int rc = 0;
    for (int i = 0; i < 100 && rc == 0; i++) /* the first writes may land before the reset */
        rc = edl_net_write_all(c, b, sizeof b, t0 + 10000);
    assert_int_equal(rc, EDL_EPEER);
    assert_true(edl_monotonic_ms() - t0 < 5000);
    close(c);
    close(l); /* nobody listens on port now */
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    t0 = edl_monotonic_ms();
    assert_int_equal(edl_net_dial(ep, t0 + 10000, &c), EDL_EUNAVAIL);
    assert_int_equal(errno, ECONNREFUSED);
    assert_true(edl_monotonic_ms() - t0 < 5000);
}

/* "host:port" resolves one way everywhere: the last colon splits, IPv6 in brackets. */
static void test_net_resolves_host_and_port(void **state)
{
    (void)state;
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    assert_int_equal(edl_net_resolve("127.0.0.1:8080", &sa, &len), 0);
    assert_int_equal(sa.ss_family, AF_INET);
    assert_int_equal(ntohs(((struct sockaddr_in *)&sa)->sin_port), 8080);
    len = sizeof sa;
    assert_int_equal(edl_net_resolve("[::1]:7", &sa, &len), 0);
    assert_int_equal(sa.ss_family, AF_INET6);
    assert_int_equal(ntohs(((struct sockaddr_in6 *)&sa)->sin6_port), 7);
    const char *bad[] = {"127.0.0.1", ":80", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:70000",
                         "no.such.host.invalid:80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(edl_net_resolve(bad[i], &sa, &len), EDL_EINVAL);
    int fd;
    assert_int_equal(edl_net_listen("no.such.host.invalid", 0, &fd, NULL), EDL_ECONFIG);
}

/* ---- streams of lines and stoppable transfers ---------------------------------------------- */

typedef struct {
    char got[8][32];
    int n, stop_at; /* on_line refuses line stop_at */
} lines_seen;

static bool take_line(void *arg, const char *line, size_t len)
{
    lines_seen *s = arg;
    if (s->n == s->stop_at)
        return false;
    snprintf(s->got[s->n++], sizeof s->got[0], "%.*s", (int)len, line);
    return true;
}

/* Lines arrive cut anywhere: each whole line is handed over once, empty ones skipped, the
 * unfinished one held within its bound; a refusal ends the feed. */
static void test_lines_are_split_across_pieces_within_a_bound(void **state)
{
    (void)state;
    edl_bytebuf held = {.max = 8};
    lines_seen s = {.stop_at = -1};
    const char *pieces[] = {"ab", "c\n\nde", "f\ng", "hi\n"};
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(edl_lines_feed(&held, pieces[i], strlen(pieces[i]), take_line, &s), 0);
    assert_int_equal(s.n, 3);
    assert_string_equal(s.got[0], "abc");
    assert_string_equal(s.got[1], "def");
    assert_string_equal(s.got[2], "ghi");
    assert_int_equal(held.len, 0);
    assert_int_equal(edl_lines_feed(&held, "12345", 5, take_line, &s), 0);
    assert_int_equal(edl_lines_feed(&held, "6789\n", 5, take_line, &s), EDL_ETOOBIG);
    edl_bytebuf_clear(&held);
    s = (lines_seen){.stop_at = 1};
    assert_int_equal(edl_lines_feed(&held, "x\ny\nz\n", 6, take_line, &s), EDL_ECLOSED);
    assert_int_equal(s.n, 1);
    edl_bytebuf_clear(&held);
}

typedef struct {
    CURLM *multi;
    CURL *h;
    atomic_bool stop;
    atomic_int cc;  /* -1 while the transfer runs */
} stoppable;

static bool stop_read(void *arg)
{
    return atomic_load(&((stoppable *)arg)->stop);
}

static void *perform_thread(void *arg)
{
    stoppable *x = arg;
    atomic_store(&x->cc, (int)edl_http_perform(x->multi, x->h, stop_read, x));
    return NULL;
}

/* A transfer to a server that never answers ends at once when another thread stops it, not at
 * its next timeout. */
static void test_http_transfer_stops_at_once_when_asked(void **state)
{
    (void)state;
    int l, port, c;
    assert_int_equal(net_pair(&l, &port, &c, NULL), 0);
    close(c);
    edl_http_global_init();
    stoppable x = {.multi = curl_multi_init(), .h = curl_easy_init()};
    atomic_init(&x.stop, false);
    atomic_init(&x.cc, -1);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    edl_http_prepare(x.h, &(edl_http_opts){.timeout_ms = 60000});
    curl_easy_setopt(x.h, CURLOPT_URL, url);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, perform_thread, &x), 0);
    /* the request is on its way: the server's queue holds its connection */
    assert_int_equal(edl_net_wait(l, POLLIN, edl_monotonic_ms() + 10000), 0);
    assert_int_equal(atomic_load(&x.cc), -1);
    int64_t t0 = edl_monotonic_ms();
    atomic_store(&x.stop, true);
    curl_multi_wakeup(x.multi);
    pthread_join(t, NULL);
    assert_true(edl_monotonic_ms() - t0 < 900); /* the wake-up, not the once-a-second check */
    assert_int_equal(atomic_load(&x.cc), CURLE_ABORTED_BY_CALLBACK);
    curl_easy_cleanup(x.h);
    curl_multi_cleanup(x.multi);
    close(l);
}

/* ---- child processes ----------------------------------------------------------------------- */

static char dir[] = "/tmp/edl-test-core-XXXXXX";

static void test_spawn_places_fds_resets_signals_and_keeps_the_rest_out(void **state)
{
    (void)state;
    char log[300], out[4096];
    snprintf(log, sizeof log, "%s/child.log", dir);
    int p[2];
    assert_int_equal(pipe(p), 0);                      /* p[0] goes to fd 5 */
    int stray = open("/dev/null", O_RDONLY);           /* no close-on-exec: must not leak */
    assert_true(stray >= 0);
    signal(SIGPIPE, SIG_IGN);                          /* ignored and blocked here... */
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, &old);
    char *const env_set[] = {"EDL_TEST_VAR=yes", NULL};
    static const char *const unset[] = {"HOME", NULL};
    char **env = edl_env_build(NULL, unset, env_set);
    assert_non_null(env);
    char *argv[] = {"sh", "-c",
                    "echo var=$EDL_TEST_VAR home=${HOME-unset}; read line <&5; echo got=$line; "
                    "ls /proc/self/fd | tr '\\n' ' '; echo; grep -E 'Sig(Blk|Ign)' /proc/self/status",
                    NULL};
    edl_spawn_opts so = {.argv = argv, .envp = env, .log_path = log, .fds = {{p[0], 5}},
                         .n_fds = 1, .new_group = true};
    pid_t pid;
    char err[256];
    assert_int_equal(edl_spawn(&so, &pid, err, sizeof err), 0); /* "sh" found in PATH */
    sigprocmask(SIG_SETMASK, &old, NULL);
    signal(SIGPIPE, SIG_DFL);
    edl_env_free(env);
    close(p[0]);
    assert_int_equal(write(p[1], "ping\n", 5), 5);
    close(p[1]);
    assert_int_equal(harness_wait_exit(pid, 5000), 0);
    close(stray);
    harness_read_file(log, out, sizeof out);
    print_message("%s", out);
    assert_non_null(strstr(out, "var=yes home=unset"));
    assert_non_null(strstr(out, "got=ping"));
    /* fds 0-2, 5 and the one ls opens to list them: nothing of ours beyond fd 5 */
    assert_non_null(strstr(out, "0 1 2 3 5 \n"));
    assert_non_null(strstr(out, "SigBlk:\t0000000000000000"));
    assert_non_null(strstr(out, "SigIgn:\t0000000000000000"));
}

static void test_spawn_reports_what_cannot_run(void **state)
{
    (void)state;
    char path[300], err[256];
    pid_t pid = 0;
    char *missing[] = {"edl-no-such-program", NULL};
    edl_spawn_opts so = {.argv = missing};
    assert_int_equal(edl_spawn(&so, &pid, err, sizeof err), EDL_ECONFIG);
    assert_non_null(strstr(err, "edl-no-such-program: not found in PATH"));
    char *nopath[] = {"/nonexistent/prog", NULL};
    so.argv = nopath;
    assert_int_equal(edl_spawn(&so, &pid, err, sizeof err), EDL_ECONFIG);
    assert_string_equal(err, "/nonexistent/prog: No such file or directory");
    /* executable bit, but not a program the kernel can run: exec itself fails */
    snprintf(path, sizeof path, "%s/not-a-program", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("\x7f" "ELF garbage", f);
    fclose(f);
    chmod(path, 0755);
    char *bad[] = {path, NULL};
    so.argv = bad;
    assert_int_equal(edl_spawn(&so, &pid, err, sizeof err), EDL_EIO);
    assert_non_null(strstr(err, "cannot execute"));
    assert_non_null(strstr(err, "not-a-program"));
    so = (edl_spawn_opts){.argv = bad, .n_fds = 1, .fds = {{0, 1}}}; /* fd 1 is not ours to set */
    assert_int_equal(edl_spawn(&so, &pid, err, sizeof err), EDL_EINVAL);
}

/* ---- the metrics server ------------------------------------------------------------------- */

typedef struct served {
    edl_metrics_server *s;
    pthread_t th;
    atomic_bool stop;
    atomic_int scrapes;
} served;

static void write_test_metrics(void *arg, edl_prom *p)
{
    served *sv = arg;
    const char *labels[] = {"job", "j\"1\\\n", "pod", "p", NULL}; /* quote, backslash, newline */
    p->labels = labels;
    edl_prom_metric(p, "edl_test_up", "gauge", "1 while the test serves.", 1);
    edl_prom_family(p, "edl_test_state", "gauge", "1 for the current state.");
    edl_prom_sample(p, "edl_test_state", "state", "a", 1);
    edl_prom_sample(p, "edl_test_state", "state", "b", 0);
    edl_prom_metric(p, "edl_test_scrapes_total", "counter", "Scrapes.", ++sv->scrapes);
    p->labels = NULL;
}

/* The owner's loop: poll the server's fd within its timeout, then serve. */
static void *serve_loop(void *arg)
{
    served *sv = arg;
    while (!sv->stop) {
        int t = edl_metrics_timeout_ms(sv->s);
        struct pollfd pf = {.fd = edl_metrics_fd(sv->s), .events = POLLIN};
        poll(&pf, 1, t < 0 || t > 50 ? 50 : t);
        edl_metrics_serve(sv->s);
    }
    return NULL;
}

static void serve_start(served *sv, const char *addr)
{
    memset(sv, 0, sizeof *sv);
    edl_metrics_opts o = {.addr = addr, .port = 0};
    assert_int_equal(edl_metrics_open(&o, write_test_metrics, sv, &sv->s), 0);
    assert_true(edl_metrics_port(sv->s) > 0);
    assert_int_equal(pthread_create(&sv->th, NULL, serve_loop, sv), 0);
}

static void serve_stop(served *sv)
{
    sv->stop = true;
    pthread_join(sv->th, NULL);
    edl_metrics_close(sv->s);
}

/* A histogram's buckets are cumulative, +Inf holds every observation, and the constant
 * labels come before le. */
static void test_prom_histogram_is_cumulative(void **state)
{
    (void)state;
    static const double bounds[] = {1, 5};
    edl_prom_hist h = {.bounds = bounds, .n = 2};
    edl_prom_observe(&h, 0.5);
    edl_prom_observe(&h, 3);
    edl_prom_observe(&h, 1);
    edl_prom_observe(&h, 60);
    const char *labels[] = {"job", "j", NULL};
    edl_prom p = {.labels = labels};
    edl_prom_histogram(&p, "x_seconds", "X.", &h);
    assert_false(p.oom);
    assert_string_equal(p.buf, "# HELP x_seconds X.\n# TYPE x_seconds histogram\n"
                               "x_seconds_bucket{job=\"j\",le=\"1\"} 2\n"
                               "x_seconds_bucket{job=\"j\",le=\"5\"} 3\n"
                               "x_seconds_bucket{job=\"j\",le=\"+Inf\"} 4\n"
                               "x_seconds_sum{job=\"j\"} 64.500000\n"
                               "x_seconds_count{job=\"j\"} 4\n");
    free(p.buf);
}

/* A connection to 127.0.0.1:port that starts a request and never ends it (-1: refused). */
static int loris_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        send(fd, "GET /metrics HTTP/1.1\r\nX: ", 26, MSG_NOSIGNAL) != 26) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether the server closed fd (its end read, or reset). */
static bool loris_closed(int fd)
{
    char b[64];
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* How many of the n connections the server closed. */
static int count_closed(const int *fds, int n)
{
    int closed = 0;
    for (int i = 0; i < n; i++)
        closed += loris_closed(fds[i]);
    return closed;
}

static void test_metrics_server_answers_and_survives_bad_clients(void **state)
{
    (void)state;
    served sv;
    serve_start(&sv, "127.0.0.1");
    int port = edl_metrics_port(sv.s);
    static char body[65536];
    assert_int_equal(harness_http_get(port, "/metrics", body, sizeof body), 200);
    assert_non_null(strstr(body, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(body, "# HELP edl_test_up 1 while the test serves.\n"
                                 "# TYPE edl_test_up gauge\n"
                                 "edl_test_up{job=\"j\\\"1\\\\\\n\",pod=\"p\"} 1\n"));
    assert_non_null(strstr(body, "edl_test_state{job=\"j\\\"1\\\\\\n\",pod=\"p\",state=\"b\"} 0\n"));
    assert_int_equal(harness_http_get(port, "/healthz", body, sizeof body), 200);
    assert_non_null(strstr(body, "\r\n\r\nok\n"));
    assert_int_equal(harness_http_get(port, "/nope", body, sizeof body), 404);
    const char head[] = "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(harness_http_request(port, head, sizeof head - 1, body, sizeof body), 200);
    assert_null(strstr(body, "edl_test_up")); /* headers only */
    const char post[] = "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc";
    assert_int_equal(harness_http_request(port, post, sizeof post - 1, body, sizeof body), 405);
    /* hostile requests get a 4xx and the server goes on */
    char *big = malloc(20000);
    memset(big, 'a', 20000);
    memcpy(big, "GET /", 5); /* a request line that never ends within the limit */
    int st = harness_http_request(port, big, 20000, body, sizeof body);
    assert_true(st >= 400 && st < 500);
    free(big);
    /* a request line that is not one: libmicrohttpd closes the connection without a word */
    st = harness_http_request(port, "BLAH\r\n\r\n", 8, body, sizeof body);
    assert_true(st == -1 || st == 400);
    /* more idle connections than the limit (32): each newcomer past it cuts the oldest, and
     * the server serves again once they go */
    int fds[40];
    for (int i = 0; i < 40; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        connect(fds[i], (struct sockaddr *)&a, sizeof a);
    }
    int cut = 0; /* the server has taken all 40 in: 8 of them cut */
    if (!HARNESS_WAIT_UNTIL((cut = count_closed(fds, 40)) >= 8, 5000))
        fail_msg("40 idle connections: the server cut %d, not the 8 past its limit", cut);
    for (int i = 0; i < 40; i++)
        close(fds[i]);
    int64_t end = harness_now_ms() + 5000;
    while (harness_http_get(port, "/metrics", body, sizeof body) != 200 && harness_now_ms() < end)
        harness_sleep_ms(50);
    assert_non_null(strstr(body, "edl_test_scrapes_total"));
    serve_stop(&sv);
}

enum { LORISES = 32 };

typedef struct lorises {
    int port, fds[LORISES];
    pthread_t th;
    atomic_bool stop;
    atomic_int closed; /* by the server */
    atomic_int rounds; /* of a byte on each connection */
} lorises;

/* One byte every 2 s on each connection, each a header that never ends; a connection the
 * server closed comes back at once, as an attacker's would. */
static void *loris_main(void *arg)
{
    lorises *l = arg;
    while (!l->stop) {
        for (int i = 0; i < LORISES; i++) {
            if (l->fds[i] >= 0 && (loris_closed(l->fds[i]) ||
                                   send(l->fds[i], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1)) {
                close(l->fds[i]);
                l->fds[i] = -1;
                l->closed++;
            }
            if (l->fds[i] < 0)
                l->fds[i] = loris_connect(l->port);
        }
        l->rounds++;
        for (int k = 0; k < 40 && !l->stop; k++)
            harness_sleep_ms(50);
    }
    return NULL;
}

/* Slow clients (one byte every 2 s, the request never done) hold every connection the server
 * takes: scrapes still succeed, each slow request is closed once it is 5 s old, and a single
 * one alone is closed at 5 s though it never goes idle. */
static void test_metrics_scrapes_succeed_under_slow_clients_and_old_requests_are_closed(
    void **state)
{
    (void)state;
    served sv;
    serve_start(&sv, "127.0.0.1");
    int port = edl_metrics_port(sv.s);
    static char body[65536];
    /* one slow request alone: closed at its 5 s deadline */
    int one = loris_connect(port);
    assert_true(one >= 0);
    int64_t t0 = harness_now_ms();
    while (!loris_closed(one) && harness_now_ms() - t0 < 9000) {
        send(one, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        struct pollfd pf = {.fd = one, .events = POLLIN};
        poll(&pf, 1, 500); /* the slow client's pace, a byte every 0.5 s, or the server's close */
    }
    int64_t lived = harness_now_ms() - t0;
    close(one);
    print_message("a request sending a byte every 0.5 s was closed after %lld ms\n",
                  (long long)lived);
    assert_true(lived >= 4500 && lived < 7000);
    /* 32 of them, coming back when closed, and a scrape every 250 ms for 8 s */
    lorises *l = calloc(1, sizeof *l);
    l->port = port;
    for (int i = 0; i < LORISES; i++)
        l->fds[i] = loris_connect(port);
    assert_int_equal(pthread_create(&l->th, NULL, loris_main, l), 0);
    assert_true(HARNESS_WAIT_UNTIL(l->rounds >= 1, 5000)); /* the slow clients under way first */
    int ok = 0, failed = 0;
    /* a scrape every 250 ms: the pace of a busy Prometheus */
    for (int64_t end = harness_now_ms() + 8000; harness_now_ms() < end; harness_sleep_ms(250)) {
        if (harness_http_get(port, "/metrics", body, sizeof body) == 200 &&
            strstr(body, "edl_test_scrapes_total"))
            ok++;
        else
            failed++;
    }
    l->stop = true;
    pthread_join(l->th, NULL);
    for (int i = 0; i < LORISES; i++)
        if (l->fds[i] >= 0)
            close(l->fds[i]);
    print_message("under %d slow clients: %d scrapes ok, %d failed; the server closed %d slow "
                  "connections\n", LORISES, ok, failed, (int)l->closed);
    assert_int_equal(failed, 0);
    assert_true(l->closed >= LORISES); /* by their deadline or to make room for a scrape */
    free(l);
    serve_stop(&sv);
}

/* A program's --metrics-port: a port, 0 (off) or auto; anything else is refused whole. */
static void test_metrics_port_option_takes_a_port_or_auto(void **state)
{
    (void)state;
    int port = 1;
    assert_int_equal(edl_metrics_port_parse("9400", &port), 0);
    assert_int_equal(port, 9400);
    assert_int_equal(edl_metrics_port_parse("0", &port), 0);
    assert_int_equal(port, 0);
    assert_int_equal(edl_metrics_port_parse("auto", &port), 0);
    assert_int_equal(port, EDL_METRICS_PORT_AUTO);
    assert_int_equal(edl_metrics_listen_port(port), 0); /* the server's "a free port" */
    assert_int_equal(edl_metrics_listen_port(9400), 9400);
    const char *bad[] = {"", "-1", "65536", "9400x", "Auto", "any", " 1", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        port = 7;
        assert_int_equal(edl_metrics_port_parse(bad[i], &port), EDL_EINVAL);
        assert_int_equal(port, 7);
    }
    assert_int_equal(edl_metrics_port_parse(NULL, &port), EDL_EINVAL);
}

static void test_metrics_server_listens_where_it_is_told(void **state)
{
    (void)state;
    served sv;
    serve_start(&sv, "127.0.0.1");
    int port = edl_metrics_port(sv.s);
    /* a second server on the same address and port cannot listen */
    edl_metrics_server *other = NULL;
    edl_metrics_opts o = {.addr = "127.0.0.1", .port = port};
    assert_int_equal(edl_metrics_open(&o, write_test_metrics, &sv, &other), EDL_EIO);
    assert_null(other);
    /* bound to 127.0.0.1 only: 127.0.0.2 (also loopback) is refused */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
    assert_int_not_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    close(fd);
    serve_stop(&sv);
    o = (edl_metrics_opts){.addr = "localhost"}; /* an IP literal, not a name */
    assert_int_equal(edl_metrics_open(&o, write_test_metrics, &sv, &other), EDL_EINVAL);
    o = (edl_metrics_opts){.addr = "127.0.0.1", .port = 70000};
    assert_int_equal(edl_metrics_open(&o, write_test_metrics, &sv, &other), EDL_EINVAL);
    /* IPv6 where the host has it */
    o = (edl_metrics_opts){.addr = "::1"};
    if (edl_metrics_open(&o, write_test_metrics, &sv, &other) == 0) {
        int p6 = edl_metrics_port(other);
        assert_true(p6 > 0);
        edl_metrics_close(other);
    } else {
        print_message("no IPv6 loopback here: the ::1 case is skipped\n");
    }
}

/* ---- the event loop ------------------------------------------------------------------------ */

typedef struct {
    int reads, writes, fired, turns, signo, follow_fd;
    int64_t due, fired_at;
    char got[16];
} loop_seen;

static void on_read(edl_loop *l, int fd, int events, void *arg)
{
    loop_seen *s = arg;
    assert_true(events & EDL_LOOP_READ);
    ssize_t n = read(fd, s->got, sizeof s->got - 1);
    s->got[n > 0 ? n : 0] = '\0';
    s->reads++;
    edl_loop_stop(l, 7);
}

static void on_timer(edl_loop *l, void *arg)
{
    loop_seen *s = arg;
    s->fired++;
    s->fired_at = edl_monotonic_ms();
    s->due = 0; /* one shot: cleared, else it runs again */
    edl_loop_stop(l, 3);
}

static void count_turn(edl_loop *l, void *arg)
{
    (void)l;
    ((loop_seen *)arg)->turns++;
}

static void test_loop_calls_an_fd_back_when_readable_and_run_returns_the_stop_code(void **state)
{
    (void)state;
    edl_loop *l;
    assert_int_equal(edl_loop_open(-1, &l), 0);
    int p[2];
    assert_int_equal(pipe(p), 0);
    loop_seen s = {0};
    assert_int_equal(edl_loop_fd_add(l, p[0], EDL_LOOP_READ, on_read, &s), 0);
    edl_loop_after_turn(l, count_turn, &s);
    assert_int_equal(edl_loop_turn(l, 0), 0); /* nothing ready: no callback */
    assert_int_equal(s.reads, 0);
    assert_int_equal(s.turns, 1);
    assert_int_equal(write(p[1], "hi", 2), 2);
    assert_int_equal(edl_loop_run(l), 7);
    assert_int_equal(s.reads, 1);
    assert_string_equal(s.got, "hi");
    edl_loop_fd_del(l, p[0]); /* deleted: a readable fd is not reported any more */
    assert_int_equal(write(p[1], "x", 1), 1);
    assert_int_equal(edl_loop_turn(l, 0), 0);
    assert_int_equal(s.reads, 1);
    edl_loop_free(l);
    close(p[0]);
    close(p[1]);
}

static void test_loop_sleeps_until_the_earliest_timer_and_no_longer(void **state)
{
    (void)state;
    edl_loop *l;
    assert_int_equal(edl_loop_open(3000, &l), 0); /* a loop blind to timers wakes at 3 s */
    loop_seen s = {0}, late = {0};
    int64_t t0 = edl_monotonic_ms();
    s.due = t0 + 150;
    late.due = t0 + 60000;
    assert_int_equal(edl_loop_timer_add(l, &late.due, on_timer, &late), 0);
    assert_int_equal(edl_loop_timer_add(l, &s.due, on_timer, &s), 0);
    assert_int_equal(edl_loop_run(l), 3); /* no fd at all: only the timer can end the wait */
    assert_int_equal(s.fired, 1);
    assert_int_equal(late.fired, 0);
    assert_true(s.fired_at >= t0 + 150);
    assert_true(s.fired_at < t0 + 2500);
    assert_int_equal(s.due, 0);
    /* A cleared timer never fires again; the loop's own bound ends the turn. */
    assert_int_equal(edl_loop_turn(l, 0), 0);
    assert_int_equal(s.fired, 1);
    edl_loop_free(l);
}

static int follow_src(void *arg, int *events)
{
    *events = EDL_LOOP_WRITE;
    return ((loop_seen *)arg)->follow_fd;
}

static void on_write(edl_loop *l, int fd, int events, void *arg)
{
    (void)l;
    (void)fd;
    assert_true(events & EDL_LOOP_WRITE);
    ((loop_seen *)arg)->writes++;
}

static int64_t follow_due(void *arg)
{
    return ((loop_seen *)arg)->due;
}

static void test_loop_follows_fds_and_due_times_that_come_and_go(void **state)
{
    (void)state;
    edl_loop *l;
    assert_int_equal(edl_loop_open(-1, &l), 0);
    int p[2];
    assert_int_equal(pipe(p), 0);
    loop_seen s = {.follow_fd = -1};
    assert_int_equal(edl_loop_fd_follow(l, follow_src, on_write, &s), 0);
    assert_int_equal(edl_loop_timer_follow(l, follow_due, on_timer, &s), 0);
    assert_int_equal(edl_loop_turn(l, 0), 0);
    assert_int_equal(s.writes, 0); /* none to follow yet */
    s.follow_fd = p[1];
    assert_int_equal(edl_loop_turn(l, 0), 0);
    assert_int_equal(s.writes, 1);
    s.follow_fd = -1;
    s.due = edl_monotonic_ms() + 50;
    assert_int_equal(edl_loop_run(l), 3);
    assert_int_equal(s.writes, 1);
    assert_int_equal(s.fired, 1);
    edl_loop_free(l);
    close(p[0]);
    close(p[1]);
}

static void on_signal(edl_loop *l, int signo, void *arg)
{
    ((loop_seen *)arg)->signo = signo;
    edl_loop_stop(l, 128 + signo);
}

typedef struct {
    edl_work w;
    int *order;
    int n, *len;
} order_work;

static void order_run(edl_work *w)
{
    (void)w;
}

static void order_done(edl_work *w)
{
    order_work *o = (order_work *)w;
    o->order[(*o->len)++] = o->n;
    free(o);
}

static void stop_when_done(edl_loop *l, void *arg)
{
    if (*(int *)arg == 3)
        edl_loop_stop(l, 0);
}

/* A guard: a loop that misses what it waits for ends at 5 s with -1, not hanging the test. */
static void give_up(edl_loop *l, void *arg)
{
    *(int64_t *)arg = 0;
    edl_loop_stop(l, -1);
}

static void test_loop_takes_signals_and_completes_works_on_its_thread(void **state)
{
    (void)state;
    edl_loop *l;
    assert_int_equal(edl_loop_open(-1, &l), 0);
    int64_t guard = edl_monotonic_ms() + 5000;
    assert_int_equal(edl_loop_timer_add(l, &guard, give_up, &guard), 0);
    sigset_t old;
    pthread_sigmask(SIG_BLOCK, NULL, &old);
    loop_seen s = {0};
    assert_int_equal(edl_loop_signals(l, EDL_SIGNALS_HUP, on_signal, &s), 0);
    assert_int_equal(edl_loop_signals(l, EDL_SIGNALS_HUP, on_signal, &s), EDL_EINVAL);
    assert_int_equal(kill(getpid(), SIGHUP), 0); /* blocked: waits for the loop's signalfd */
    assert_int_equal(edl_loop_run(l), 128 + SIGHUP);
    assert_int_equal(s.signo, SIGHUP);

    edl_worker *wk;
    assert_int_equal(edl_worker_open(&wk), 0);
    assert_int_equal(edl_loop_worker(l, wk), 0);
    int order[3], len = 0;
    for (int i = 0; i < 3; i++) {
        order_work *o = calloc(1, sizeof *o);
        *o = (order_work){.w = {.run = order_run, .done = order_done}, .order = order, .n = i,
                          .len = &len};
        assert_int_equal(edl_worker_submit(wk, &o->w), 0);
    }
    edl_loop_after_turn(l, stop_when_done, &len);
    guard = edl_monotonic_ms() + 5000;
    assert_int_equal(edl_loop_run(l), 0); /* only the worker's fd wakes it before the guard */
    assert_int_equal(len, 3);
    assert_int_equal(order[0], 0);
    assert_int_equal(order[2], 2);
    edl_worker_close(wk);
    edl_loop_free(l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static int setup(void **state)
{
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    harness_rmtree(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_error_code_has_a_name_and_a_text),
        cmocka_unit_test(test_byte_buffer_grows_to_its_bound_and_no_further),
        cmocka_unit_test(test_json_reader_checks_types_ranges_and_keeps_the_first_error),
        cmocka_unit_test(test_json_print_writes_every_number_exactly_and_leaves_the_tree),
        cmocka_unit_test(test_queue_keeps_order_bounds_producers_and_its_fd_tells_the_truth),
        cmocka_unit_test(test_works_run_off_the_loop_and_complete_on_it_in_order),
        cmocka_unit_test(test_loop_calls_an_fd_back_when_readable_and_run_returns_the_stop_code),
        cmocka_unit_test(test_loop_sleeps_until_the_earliest_timer_and_no_longer),
        cmocka_unit_test(test_loop_follows_fds_and_due_times_that_come_and_go),
        cmocka_unit_test(test_loop_takes_signals_and_completes_works_on_its_thread),
        cmocka_unit_test(test_http_backoff_doubles_caps_jitters_and_obeys_retry_after),
        cmocka_unit_test(test_addr_keys_group_sources_by_ipv4_address_and_ipv6_64),
        cmocka_unit_test(test_net_deadline_holds_on_a_peer_that_never_answers),
        cmocka_unit_test(test_net_unacked_clears_once_the_peers_kernel_holds_the_bytes),
        cmocka_unit_test(test_free_port_does_not_hand_out_a_recent_port_again),
        cmocka_unit_test(test_net_exact_read_gathers_short_reads),
        cmocka_unit_test(test_net_closed_peer_ends_reads_writes_and_dials_at_once),
        cmocka_unit_test(test_net_resolves_host_and_port),
        cmocka_unit_test(test_lines_are_split_across_pieces_within_a_bound),
        cmocka_unit_test(test_http_transfer_stops_at_once_when_asked),
        cmocka_unit_test(test_spawn_places_fds_resets_signals_and_keeps_the_rest_out),
        cmocka_unit_test(test_spawn_reports_what_cannot_run),
        cmocka_unit_test(test_prom_histogram_is_cumulative),
        cmocka_unit_test(test_metrics_server_answers_and_survives_bad_clients),
        cmocka_unit_test(test_metrics_port_option_takes_a_port_or_auto),
        cmocka_unit_test(test_metrics_server_listens_where_it_is_told),
        cmocka_unit_test(test_metrics_scrapes_succeed_under_slow_clients_and_old_requests_are_closed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
