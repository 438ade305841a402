/* install.c: `edl-agent --install DIR`, what the operator's init container runs: copy this
 * very binary (/proc/self/exe) to DIR/edl-agent, so that the worker container of an image we
 * do not own can run it from a shared emptyDir. Written to a temporary name, then renamed:
 * a half-copied agent is never started. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

static int copy_fd(int in, int out)
{
    char buf[1 << 16];
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n == 0)
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0)
                return -1;
            off += w;
        }
    }
}

int agent_install(const char *dir)
{
    char dst[4096], tmp[4200];
    if (snprintf(dst, sizeof dst, "%s/edl-agent", dir) >= (int)sizeof dst) {
        fprintf(stderr, "edl-agent --install: %s: path too long\n", dir);
        return 2;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dst, (int)getpid());
    int in = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    int out = in < 0 ? -1 : open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    int rc = in < 0 || out < 0 || copy_fd(in, out) != 0 || fsync(out) != 0 ? -1 : 0;
    int saved = errno;
    if (out >= 0 && close(out) != 0)
        rc = -1;
    if (in >= 0)
        close(in);
    if (rc == 0 && rename(tmp, dst) != 0) {
        saved = errno;
        rc = -1;
    }
    if (rc) {
        unlink(tmp);
        fprintf(stderr, "edl-agent --install: cannot copy the agent to %s: %s\n", dst,
                strerror(saved));
        return 1;
    }
    printf("edl-agent: installed %s\n", dst);
    return 0;
}
