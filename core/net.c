/* net.c: small socket helpers shared by the programs (a free port to hand to a child, the key
 * of a connection's source for per-source bounds). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "edl/common.h"

int edl_free_port(const char *ipv4)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (!ipv4 || inet_pton(AF_INET, ipv4, &sa.sin_addr) != 1)
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t len = sizeof sa;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

void edl_addr_key(const void *sockaddr, uint8_t key[EDL_ADDR_KEY_BYTES])
{
    const struct sockaddr *sa = sockaddr;
    memset(key, 0, EDL_ADDR_KEY_BYTES);
    if (sa->sa_family == AF_INET) {
        memcpy(key + 12, &((const struct sockaddr_in *)sockaddr)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sockaddr)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a))
            memcpy(key + 12, a->s6_addr + 12, 4);
        else
            memcpy(key, a->s6_addr, 8);
    }
}

void edl_peer_key(int fd, uint8_t key[EDL_ADDR_KEY_BYTES])
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getpeername(fd, (struct sockaddr *)&sa, &len) != 0)
        sa.ss_family = AF_UNSPEC;
    edl_addr_key(&sa, key);
}
