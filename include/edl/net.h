/* edl/net.h: edl's TCP socket layer (Redis's anet), under the collective's mesh, the parameter
 * server's client and server and the Python link's probe: "host:port" resolved one way, a
 * listening socket, a dial with a deadline, exact reads and writes with a deadline, and one
 * tuning of every data socket; beside them a free port to hand a child, and the key that groups
 * connections by their source. Sockets are non-blocking and close-on-exec; deadlines are
 * edl_monotonic_ms() times. Errors are EDL_E* codes; where a system call failed, errno is left
 * as it said, for the caller's message. */
#ifndef EDL_NET_H
#define EDL_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The send and receive buffers of every data socket: room for a window of 4 MiB, so a link
 * that carries tensors is not held to the kernel's default window. */
#define EDL_NET_BUF_BYTES (4 << 20)

/* TCP_NODELAY (frames go out at once) and the buffers above. On a listening socket, before
 * listen(): the sockets it accepts inherit the buffers (window scaling is agreed at the SYN). */
void edl_net_tune(int fd);
int edl_net_set_nonblock(int fd);

/* "host:port" (the last colon splits; an IPv6 host may be in brackets) into an address.
 * EDL_EINVAL when it is malformed or does not resolve. */
int edl_net_resolve(const char *ep, struct sockaddr_storage *sa, socklen_t *len);

/* A tuned, non-blocking socket listening on host (NULL or "": every address; an IPv6 host may
 * be in brackets) and port (0: one the kernel picks), SO_REUSEADDR, a backlog of 512. *fd and
 * *bound_port (may be NULL) on success; else EDL_ECONFIG (the host does not resolve) or
 * EDL_EIO (socket, bind or listen failed: errno says why). */
int edl_net_listen(const char *host, int port, int *fd, int *bound_port);

/* A tuned, non-blocking connection to sa, made before the deadline. 0 and *fd; EDL_ETIMEDOUT;
 * EDL_EUNAVAIL (refused, unreachable: errno says why); EDL_EIO (no socket). */
int edl_net_dial_addr(const struct sockaddr *sa, socklen_t len, int64_t deadline_ms, int *fd);
/* The same to "host:port" (EDL_EINVAL when it does not resolve). */
int edl_net_dial(const char *ep, int64_t deadline_ms, int *fd);

/* Whether bytes sent on the TCP connection fd still wait for the peer's acknowledgement. A
 * connection whose handshake the peer's kernel did not complete (its accept queue was full:
 * the final ACK and the data behind it are dropped and retransmitted with a growing back-off)
 * shows its first bytes unacknowledged; one the peer's kernel holds for its program does not. */
bool edl_net_unacked(int fd);

/* Wait until fd is ready for events (POLLIN, POLLOUT): 0 (ready, or hung up: the next call
 * says which), EDL_ETIMEDOUT, EDL_EIO. */
int edl_net_wait(int fd, short events, int64_t deadline_ms);

/* Exactly len bytes to or from fd, however the kernel splits them, before the deadline: 0,
 * EDL_EPEER when the connection closed or failed first, EDL_ETIMEDOUT. The socket may be
 * blocking or not. */
int edl_net_write_all(int fd, const void *buf, size_t len, int64_t deadline_ms);
int edl_net_read_all(int fd, void *buf, size_t len, int64_t deadline_ms);

/* A TCP port free on this IPv4 address now (bind to port 0, then release; NULL or an
 * unparsable address: any address); 0 when none can be had. None of the last 64 ports it
 * returned in this process is returned again. Another process may take it before the
 * caller's child binds it: callers must survive that (or bind port 0 themselves). */
int edl_free_port(const char *ipv4);

/* The key that groups connections by their source, for per-source bounds: an IPv4 address (an
 * IPv4-mapped IPv6 one alike) or an IPv6 /64 (one host may hold a whole /64). edl_addr_key
 * takes a struct sockaddr_in or sockaddr_in6; edl_peer_key the peer of a connected socket.
 * All zeros for anything else (a connection already reset has no peer). */
#define EDL_ADDR_KEY_BYTES 16
void edl_addr_key(const void *sockaddr, uint8_t key[EDL_ADDR_KEY_BYTES]);
void edl_peer_key(int fd, uint8_t key[EDL_ADDR_KEY_BYTES]);

#ifdef __cplusplus
}
#endif
#endif
