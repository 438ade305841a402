/* harness_net.c: a minimal HTTP client for tests of /metrics endpoints, and free ports, on
 * core/net.c's dial with a deadline (edl/net.h). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "edl/common.h"
#include "edl/net.h"
#include "harness.h"

/* The whole reply on fd, until the server closes it or the deadline passes. */
static size_t read_reply(int fd, char *out, size_t outlen, int64_t deadline)
{
    size_t got = 0;
    while (got < outlen - 1 && edl_net_wait(fd, POLLIN, deadline) == 0) {
        ssize_t n = recv(fd, out + got, outlen - 1 - got, 0);
        if (n > 0)
            got += (size_t)n;
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
            break;
    }
    out[got] = '\0';
    return got;
}

/* HTTP/1.0-style request on a fresh connection, within 5 s; the whole reply into out. Returns
 * its status (-1: no connection, or no reply). */
int harness_http_request(int port, const char *req, size_t req_len, char *out, size_t outlen)
{
    char ep[32];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    int64_t deadline = edl_monotonic_ms() + 5000;
    int fd;
    out[0] = '\0';
    if (edl_net_dial(ep, deadline, &fd) != 0)
        return -1;
    if (edl_net_write_all(fd, req, req_len, deadline) == 0)
        read_reply(fd, out, outlen, deadline);
    close(fd);
    int status = -1;
    sscanf(out, "HTTP/1.1 %d", &status);
    return status;
}

int harness_http_get(int port, const char *path, char *out, size_t outlen)
{
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    return harness_http_request(port, req, (size_t)n, out, outlen);
}

int harness_free_port(void)
{
    int port = edl_free_port("127.0.0.1");
    return port > 0 ? port : -1;
}

bool harness_port_open(int port)
{
    char ep[32];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    int fd;
    if (edl_net_dial(ep, edl_monotonic_ms() + 1000, &fd) != 0)
        return false;
    close(fd);
    return true;
}

