/* harness_net.c: a minimal HTTP client for tests of /metrics endpoints, and free ports. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "edl/common.h"
#include "edl/net.h"
#include "harness.h"

/* HTTP/1.0-style request on a fresh connection; the whole reply into out. Returns its status. */
int harness_http_request(int port, const char *req, size_t req_len, char *out, size_t outlen)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    size_t off = 0;
    while (off < req_len) {
        ssize_t n = send(fd, req + off, req_len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    size_t got = 0;
    ssize_t n;
    while (got < outlen - 1 && (n = recv(fd, out + got, outlen - 1 - got, 0)) > 0)
        got += (size_t)n;
    out[got] = '\0';
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
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool open = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return open;
}

