/* harness_flood.c: a flood of strangers on a loopback port, from a thread, in the shape of an
 * attacker's flood scripts: connections that stay silent, that are reset at once, that send a
 * well-formed hello without the secret, or garbage, from 127.0.0.1 and three other loopback
 * addresses; bounded in connections held, in connections made and in time. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define FLOOD_MAX_CONNECTIONS 50000

struct harness_flood {
    int port, hold, max_ms;
    uint8_t hello[256];
    size_t hello_len;
    atomic_bool stop;
    atomic_long made;
    pthread_t th;
};

/* Close fd with a reset (no TIME_WAIT left behind, and the server's next read fails). */
static void reset_close(int fd)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

/* Stranger i: a connection from 127.0.0.(1 + i % 4) (-1 when it cannot connect). */
static int stranger(const harness_flood *f, long i)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + (uint32_t)(i % 4));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons((uint16_t)f->port);
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&from, sizeof from) != 0 ||
        connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
        reset_close(fd);
        return -1;
    }
    return fd;
}

static void *flood_main(void *arg)
{
    harness_flood *f = arg;
    int *held = malloc(sizeof *held * (size_t)f->hold), nheld = 0, oldest = 0;
    static const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    int64_t end = harness_now_ms() + f->max_ms;
    for (long i = 0; held && !atomic_load(&f->stop) && i < FLOOD_MAX_CONNECTIONS &&
                     harness_now_ms() < end; i++) {
        int fd = stranger(f, i);
        if (fd < 0)
            continue;
        atomic_fetch_add(&f->made, 1);
        switch (i % 4) {
        case 0: break; /* silent */
        case 1: reset_close(fd); continue;
        case 2: (void)!send(fd, f->hello, f->hello_len, MSG_NOSIGNAL | MSG_DONTWAIT); break;
        default: (void)!send(fd, garbage, sizeof garbage - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        if (nheld == f->hold) { /* reset the oldest to make room */
            reset_close(held[oldest]);
            held[oldest] = fd;
            oldest = (oldest + 1) % f->hold;
        } else {
            held[nheld++] = fd;
        }
    }
    for (int i = 0; held && i < nheld; i++)
        reset_close(held[i]);
    free(held);
    return NULL;
}

harness_flood *harness_flood_start(int port, const void *hello, size_t hello_len, int hold,
                                   int max_ms)
{
    harness_flood *f = calloc(1, sizeof *f);
    if (!f || hello_len > sizeof f->hello || hold < 1) {
        free(f);
        return NULL;
    }
    f->port = port;
    f->hold = hold;
    f->max_ms = max_ms;
    memcpy(f->hello, hello, hello_len);
    f->hello_len = hello_len;
    atomic_init(&f->stop, false);
    atomic_init(&f->made, 0);
    if (pthread_create(&f->th, NULL, flood_main, f) != 0) {
        free(f);
        return NULL;
    }
    return f;
}

long harness_flood_made(harness_flood *f)
{
    return atomic_load(&f->made);
}

long harness_flood_stop(harness_flood *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    long made = atomic_load(&f->made);
    free(f);
    return made;
}
