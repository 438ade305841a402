/* install.c: `edl-agent --install DIR`, what the operator's init container runs, so that the
 * worker container of an image we do not own can run the agent from a shared emptyDir (DIR).
 *
 * In the images (docker/) this binary is PREFIX/bin/edl-agent and PREFIX/lib/edl/agent/ holds
 * the portable bundle of scripts/bundle-agent: an edl-agent that loads its own dynamic loader
 * and libraries from /edl/bin/lib, and those files in lib/. Then DIR/lib/ gets the bundle's
 * lib/ and DIR/edl-agent its agent, which runs in any x86-64 Linux image, even one without a
 * C library. When the image also holds the Python package (PREFIX/lib/edl/python/edl, made by
 * scripts/bundle-python), DIR/python gets it: the operator puts DIR/python on the trainer's
 * PYTHONPATH, so a Python image with torch runs edl.torch as it is. Without a bundle (a build
 * tree: the stand-in kubelet of the tests runs pods as host processes) this very binary
 * (/proc/self/exe) is copied to DIR/edl-agent. Where no /proc is mounted (a plain chroot), the
 * path this binary was started by stands for /proc/self/exe.
 *
 * Every file is written to a temporary name, then renamed, and the agent comes last: a
 * half-installed agent is never started. */
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
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

/* Copy src to dst (mode `mode`) through dst.tmp.<pid> and a rename: 0, or -1 with a message. */
static int copy_file(const char *src, const char *dst, mode_t mode)
{
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dst, (int)getpid());
    int in = open(src, O_RDONLY | O_CLOEXEC);
    int out = in < 0 ? -1 : open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    int rc = in < 0 || out < 0 || copy_fd(in, out) != 0 || fchmod(out, mode) != 0 ||
                     fsync(out) != 0 ? -1 : 0;
    int saved = errno;
    if (out >= 0 && close(out) != 0 && rc == 0) {
        saved = errno;
        rc = -1;
    }
    if (in >= 0)
        close(in);
    if (rc == 0 && rename(tmp, dst) != 0) {
        saved = errno;
        rc = -1;
    }
    if (rc) {
        if (out >= 0)
            unlink(tmp);
        fprintf(stderr, "edl-agent --install: cannot copy %s to %s: %s\n", src, dst,
                strerror(saved));
    }
    return rc;
}

/* This binary's path into out: /proc/self/exe, or where no /proc is mounted (a plain chroot)
 * the path it was started by. False when neither is known. */
static bool self_path(char out[PATH_MAX])
{
    ssize_t n = readlink("/proc/self/exe", out, PATH_MAX - 1);
    if (n > 0) {
        out[n] = '\0';
        return true;
    }
    const char *execfn = (const char *)getauxval(AT_EXECFN);
    return execfn && realpath(execfn, out);
}

/* The bundle next to this binary (<its dir>/../lib/edl/agent, holding edl-agent and lib/) into
 * out, without symbolic links: true when there is one. */
static bool find_bundle(char out[PATH_MAX])
{
    char self[PATH_MAX];
    if (!self_path(self))
        return false;
    char *slash = strrchr(self, '/');
    if (!slash)
        return false;
    *slash = '\0';
    char path[PATH_MAX + 64];
    struct stat st;
    snprintf(path, sizeof path, "%s/../lib/edl/agent", self);
    if (!realpath(path, out))
        return false;
    snprintf(path, sizeof path, "%s/edl-agent", out);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return false;
    snprintf(path, sizeof path, "%s/lib", out);
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Copy the regular files of src, and of its directories to `depth` levels, into dst (made if
 * missing): how many files, or -1 with a message. */
static int copy_tree(const char *src, const char *dst, int depth)
{
    char from[PATH_MAX + 8], to[PATH_MAX + 8];
    if (mkdir(dst, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "edl-agent --install: cannot make %s: %s\n", dst, strerror(errno));
        return -1;
    }
    DIR *d = opendir(src);
    if (!d) {
        fprintf(stderr, "edl-agent --install: cannot read %s: %s\n", src, strerror(errno));
        return -1;
    }
    int n = 0;
    struct dirent *e;
    struct stat st;
    while (n >= 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (snprintf(from, sizeof from, "%s/%s", src, e->d_name) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%s/%s", dst, e->d_name) >= (int)sizeof to) {
            fprintf(stderr, "edl-agent --install: %s/%s: path too long\n", dst, e->d_name);
            n = -1;
        } else if (stat(from, &st) != 0) {
            continue;
        } else if (S_ISREG(st.st_mode)) {
            n = copy_file(from, to, st.st_mode & 0777) == 0 ? n + 1 : -1;
        } else if (depth > 0 && S_ISDIR(st.st_mode)) {
            int m = copy_tree(from, to, depth - 1);
            n = m < 0 ? -1 : n + m;
        }
    }
    closedir(d);
    return n;
}

/* The ELF interpreter (PT_INTERP) of a 64-bit ELF file into out ("" when none or unreadable). */
static void elf_interp(const char *path, char *out, size_t len)
{
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    Elf64_Ehdr eh;
    if (fd < 0)
        return;
    if (pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh &&
        memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64)
        for (int i = 0; i < eh.e_phnum; i++) {
            Elf64_Phdr ph;
            if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (Elf64_Off)i * eh.e_phentsize)) !=
                (ssize_t)sizeof ph)
                break;
            if (ph.p_type == PT_INTERP && ph.p_filesz < len &&
                pread(fd, out, ph.p_filesz, (off_t)ph.p_offset) == (ssize_t)ph.p_filesz) {
                out[ph.p_filesz] = '\0';
                break;
            }
        }
    close(fd);
}

/* The bundle's agent finds its loader at a fixed path: say so when DIR is not that place. */
static void warn_if_elsewhere(const char *installed, const char *dir)
{
    char interp[PATH_MAX], want[PATH_MAX + 8];
    elf_interp(installed, interp, sizeof interp);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    snprintf(want, sizeof want, "%.*s/lib/", (int)n, dir);
    const char *slash = strrchr(interp, '/');
    if (!slash || strncmp(interp, want, strlen(want)) == 0)
        return;
    /* /edl/bin/lib/ld-linux-x86-64.so.2: the agent expects DIR at /edl/bin */
    int at = (int)(slash - interp);
    while (at > 0 && interp[at - 1] != '/')
        at--;
    fprintf(stderr, "edl-agent --install: warning: the installed agent's loader is %s: it runs "
                    "only where %.*s is mounted at %.*s\n", interp, (int)n, dir,
            at > 1 ? at - 1 : 1, interp);
}

/* The Python package that the image holds beside the bundle (<bundle>/../python/edl, made by
 * scripts/bundle-python: it carries its libraries) into DIR/python, for the trainer's
 * PYTHONPATH: 0 (also when the image has none), or -1 with a message. */
static int install_python(const char *bundle, const char *dir)
{
    char src[PATH_MAX + 16], dst[PATH_MAX + 48];
    struct stat st;
    snprintf(src, sizeof src, "%s/../python", bundle);
    snprintf(dst, sizeof dst, "%s/edl/__init__.py", src);
    if (stat(dst, &st) != 0)
        return 0;
    snprintf(dst, sizeof dst, "%s/python", dir);
    int n = copy_tree(src, dst, 2);
    if (n < 0)
        return -1;
    printf("edl-agent: installed the Python package edl (%d files) in %s\n", n, dst);
    return 0;
}

int agent_install(const char *dir)
{
    char dst[PATH_MAX], bundle[PATH_MAX], from[PATH_MAX + 16], libs[PATH_MAX + 8];
    if (snprintf(dst, sizeof dst, "%s/edl-agent", dir) >= (int)sizeof dst - 32) {
        fprintf(stderr, "edl-agent --install: %s: path too long\n", dir);
        return 2;
    }
    if (!find_bundle(bundle)) {
        char self[PATH_MAX];
        if (copy_file(self_path(self) ? self : "/proc/self/exe", dst, 0755) != 0)
            return 1;
        printf("edl-agent: installed %s (this binary: it needs its shared libraries where it "
               "runs)\n", dst);
        return 0;
    }
    if (install_python(bundle, dir) != 0)
        return 1;
    snprintf(libs, sizeof libs, "%s/lib", dir);
    snprintf(from, sizeof from, "%s/lib", bundle);
    int n = copy_tree(from, libs, 0);
    snprintf(from, sizeof from, "%s/edl-agent", bundle);
    if (n < 0 || copy_file(from, dst, 0755) != 0)
        return 1;
    printf("edl-agent: installed %s, and its loader and libraries (%d files) in %s, from %s\n",
           dst, n, libs, bundle);
    warn_if_elsewhere(dst, dir);
    return 0;
}
