/* file.c: the file:// back end of edl/storage.h, for a shared filesystem.
 *
 * A put writes a temporary file beside the target (".edl-tmp-*", which list never shows),
 * fsyncs it, renames it over the target and fsyncs the directory: after a crash at any moment
 * the key holds the old object or the complete new one, and NFS/CephFS clients on other nodes
 * never see a half-written file under the real name. */
#define _GNU_SOURCE
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TMP_PREFIX ".edl-tmp-"
#define IO_CHUNK (1u << 20)

typedef struct file_store {
    char root[PATH_MAX];
    unsigned long tmp_seq;
} file_store;

static int errno_code(int e)
{
    switch (e) {
    case ENOENT: case ENOTDIR: return EDL_ENOTFOUND;
    case EACCES: case EPERM: case EROFS: return EDL_EAUTH;
    case ENOMEM: return EDL_ENOMEM;
    case EFBIG: case ENOSPC: case EDQUOT: return EDL_ETOOBIG;
    default: return EDL_EIO;
    }
}

static int file_open(edl_storage *s, const edl_storage_config *cfg, const char *rest)
{
    (void)cfg;
    if (rest[0] != '/')
        return storage_fail(s, EDL_EINVAL, "file URI \"%s\" must name an absolute path "
                            "(file:///mnt/ckpt)", s->uri);
    file_store *f = calloc(1, sizeof *f);
    if (!f)
        return EDL_ENOMEM;
    size_t n = strlen(rest);
    while (n > 1 && rest[n - 1] == '/')
        n--;
    if (n >= sizeof f->root - 600) { /* room for a key and a temporary suffix */
        free(f);
        return storage_fail(s, EDL_EINVAL, "file URI \"%.100s...\" is too long a path", s->uri);
    }
    memcpy(f->root, rest, n);
    f->root[n] = '\0';
    s->impl = f;
    return 0;
}

static void file_close(edl_storage *s)
{
    free(s->impl);
}

/* Root and key lengths are bounded at open and by key validation, so this always fits. */
static void key_path(edl_storage *s, const char *key, char *path, size_t len)
{
    file_store *f = s->impl;
    if ((size_t)snprintf(path, len, "%s/%s", f->root, key) >= len)
        path[0] = '\0';
}

static int fsync_dir(const char *path);

/* mkdir -p of the directory part of path (not below the root's parent). Every directory it
 * creates is made durable (its parent is fsynced), or a crash could lose the directory of a
 * file that was itself synced and renamed into it. */
static int make_parents(edl_storage *s, char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int r = mkdir(path, 0755);
        int e = errno;
        if (r == 0 && fsync_dir(path) != 0) {
            r = -1;
            e = errno;
        }
        *p = '/';
        if (r != 0 && e != EEXIST)
            return storage_fail(s, errno_code(e), "cannot create directory for %s: %s", path,
                                strerror(e));
    }
    return 0;
}

/* fsync the directory that holds path (a new entry in it is durable once this returns). */
static int fsync_dir(const char *path)
{
    char dir[PATH_MAX];
    if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir)
        return -1;
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Streamed write-back: once a window of the file is written, the disk starts on it while the
 * next one is written, and the one before it (by now on the disk or nearly) is waited for and
 * dropped from the page cache. The disk works all along the write instead of only in the final
 * fsync, the writer is paced at the disk's speed with two windows in flight, and a checkpoint
 * does not fill the page cache with bytes nobody reads (evicting the trainer's own files).
 * Only a hint: the fsync before the rename is still what makes the object durable, so a
 * filesystem without sync_file_range (or one that refuses it) loses nothing. */
#define FLUSH_WINDOW (8u << 20)

typedef struct flusher {
    int fd;
    /* [done, started): being written back; [started, written): not started yet */
    off_t done, started, written;
} flusher;

static void flush_ahead(flusher *f, size_t n)
{
    f->written += (off_t)n;
    if (f->written - f->started < (off_t)FLUSH_WINDOW)
        return;
    sync_file_range(f->fd, f->started, f->written - f->started, SYNC_FILE_RANGE_WRITE);
    if (f->started > f->done) {
        sync_file_range(f->fd, f->done, f->started - f->done, SYNC_FILE_RANGE_WAIT_BEFORE |
                        SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        posix_fadvise(f->fd, f->done, f->started - f->done, POSIX_FADV_DONTNEED);
    }
    f->done = f->started;
    f->started = f->written;
}

/* Write the whole source to fd; on failure the message is set. */
static int write_source(edl_storage *s, int fd, storage_source *src, const char *tmp)
{
    /* A buffer goes in pieces, each shown to the observer just before it is written, while
     * it is still in the cache. */
    flusher fl = {.fd = fd};
    for (size_t off = 0; !src->read && off < src->len; off += IO_CHUNK) {
        size_t n = src->len - off < IO_CHUNK ? src->len - off : IO_CHUNK;
        storage_source_observe(src, src->buf + off, n);
        if (write_all(fd, src->buf + off, n) != 0)
            return storage_fail(s, errno_code(errno), "cannot write %s: %s", tmp, strerror(errno));
        flush_ahead(&fl, n);
    }
    if (!src->read)
        return 0;
    char *chunk = malloc(IO_CHUNK);
    if (!chunk)
        return EDL_ENOMEM;
    int rc = 0;
    for (;;) {
        ssize_t n = storage_source_fill(s, src, chunk, IO_CHUNK);
        if (n <= 0) {
            rc = (int)n;
            break;
        }
        if (write_all(fd, chunk, (size_t)n) != 0) {
            rc = storage_fail(s, errno_code(errno), "cannot write %s: %s", tmp, strerror(errno));
            break;
        }
        flush_ahead(&fl, (size_t)n);
    }
    free(chunk);
    return rc;
}

static int file_put(edl_storage *s, const char *key, storage_source *src)
{
    file_store *f = s->impl;
    char path[PATH_MAX], tmp[PATH_MAX + 64];
    key_path(s, key, path, sizeof path);
    int rc = make_parents(s, path);
    if (rc)
        return rc;
    const char *base = strrchr(path, '/') + 1;
    if ((size_t)snprintf(tmp, sizeof tmp, "%.*s" TMP_PREFIX "%s.%ld.%lu.%u", (int)(base - path),
                         path, base, (long)getpid(), ++f->tmp_seq, storage_rand(s)) >= sizeof tmp)
        return storage_fail(s, EDL_EINVAL, "path too long for %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return storage_fail(s, errno_code(errno), "cannot create %s: %s", tmp, strerror(errno));
    rc = write_source(s, fd, src, tmp);
    if (rc == 0 && fsync(fd) != 0)
        rc = storage_fail(s, errno_code(errno), "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = storage_fail(s, errno_code(errno), "close %s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = storage_fail(s, errno_code(errno), "rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc != 0) {
        unlink(tmp);
        return rc;
    }
    /* Without this the rename itself may be lost in a crash of the machine. */
    if (fsync_dir(path) != 0)
        return storage_fail(s, errno_code(errno), "fsync of the directory of %s: %s", path,
                            strerror(errno));
    return 0;
}

/* Open path for reading only when it is a regular file: a FIFO, a device or a directory put
 * where an object belongs would block a reader or feed it without end, so it reads as absent
 * (what stat says of it too). O_NONBLOCK keeps the open of a FIFO from waiting for a writer;
 * it is cleared before reading. A put renames a file into place, never a link: a link at a
 * key (to /dev/zero, to a file outside the store) is someone else's, and absent too. */
static int open_regular(edl_storage *s, const char *path, int *fd_out, uint64_t *size_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0 && errno == ELOOP)
        return storage_fail(s, EDL_ENOTFOUND, "%s is a symbolic link, which the store never "
                            "writes: remove it", path);
    if (fd < 0)
        return storage_fail(s, errno_code(errno), "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return storage_fail(s, errno_code(e), "fstat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return storage_fail(s, EDL_ENOTFOUND, "%s is not a regular file (a FIFO, device or "
                            "directory where an object belongs): remove it", path);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *fd_out = fd;
    *size_out = (uint64_t)sb.st_size;
    return 0;
}

static int file_get_stream(edl_storage *s, const char *key, edl_storage_write_fn write_fn,
                           void *arg, uint64_t *size_out)
{
    char path[PATH_MAX];
    key_path(s, key, path, sizeof path);
    *size_out = 0;
    int fd = -1;
    uint64_t size;
    int rc = open_regular(s, path, &fd, &size);
    if (rc != 0)
        return rc;
    char *chunk = malloc(IO_CHUNK);
    rc = chunk ? 0 : EDL_ENOMEM;
    while (rc == 0) {
        ssize_t n = read(fd, chunk, IO_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = storage_fail(s, errno_code(errno), "read %s: %s", path, strerror(errno));
            break;
        }
        if (n == 0)
            break;
        rc = write_fn(arg, chunk, (size_t)n);
        if (rc != 0)
            storage_fail(s, rc, "reading %s: the caller's sink stopped it: %s", path,
                         edl_strerror(rc));
        else
            *size_out += (uint64_t)n;
    }
    free(chunk);
    close(fd);
    return rc;
}

/* One read(2) of up to len bytes: its count, 0 at the end, or -1 with errno (EINTR retried). */
static ssize_t read_some(int fd, char *p, size_t len)
{
    ssize_t n;
    do
        n = read(fd, p, len);
    while (n < 0 && errno == EINTR);
    return n;
}

/* Straight into the caller's memory: the page cache is copied once, by the kernel, into dst,
 * and each piece is shown to observe while it is still in the CPU's cache. A file larger than
 * cap (found by its size, or by a byte past cap if it grew while read) is refused. */
static int file_get_into(edl_storage *s, const char *key, char *dst, size_t cap,
                         edl_storage_observe_fn observe, void *arg, uint64_t *size_out)
{
    char path[PATH_MAX];
    key_path(s, key, path, sizeof path);
    *size_out = 0;
    int fd = -1;
    uint64_t size;
    int rc = open_regular(s, path, &fd, &size);
    if (rc == 0 && size > cap)
        rc = storage_fail(s, EDL_ETOOBIG, "%s holds %" PRIu64 " bytes, more than the %zu "
                          "of the buffer given", path, size, cap);
    if (rc == 0)
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    size_t got = 0;
    while (rc == 0) {
        char past;
        size_t want = cap - got < IO_CHUNK ? cap - got : IO_CHUNK;
        ssize_t n = read_some(fd, want ? dst + got : &past, want ? want : 1);
        if (n < 0)
            rc = storage_fail(s, errno_code(errno), "read %s: %s", path, strerror(errno));
        else if (n > 0 && !want)
            rc = storage_fail(s, EDL_ETOOBIG, "%s grew past the %zu bytes of the buffer "
                              "given while it was read", path, cap);
        if (rc != 0 || n == 0)
            break;
        if (observe)
            observe(arg, dst + got, (size_t)n);
        got += (size_t)n;
    }
    *size_out = got;
    if (fd >= 0)
        close(fd);
    return rc;
}

static int file_stat(edl_storage *s, const char *key, edl_storage_stat *st)
{
    char path[PATH_MAX];
    struct stat sb;
    key_path(s, key, path, sizeof path);
    if (stat(path, &sb) != 0)
        return storage_fail(s, errno_code(errno), "stat %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return storage_fail(s, EDL_ENOTFOUND, "%s is not a regular file", path);
    st->size = (uint64_t)sb.st_size;
    st->mtime = (int64_t)sb.st_mtime;
    return 0;
}

/* Walk dir (the key prefix rel, "" or ending in "/") and add every file whose key starts with
 * prefix. Directories that cannot match are not entered. */
static int walk(edl_storage *s, const char *dir, const char *rel, const char *prefix, char ***keys,
                size_t *n, size_t *cap, int depth)
{
    if (depth > 32)
        return 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT || errno == ENOTDIR)
            return 0;
        return storage_fail(s, errno_code(errno), "cannot list %s: %s", dir, strerror(errno));
    }
    int rc = 0;
    struct dirent *e;
    size_t plen = strlen(prefix);
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        if (strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0)
            continue;
        char key[PATH_MAX], path[PATH_MAX * 2];
        if ((size_t)snprintf(key, sizeof key, "%s%s", rel, e->d_name) >= sizeof key)
            continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
            continue;
        struct stat sb;
        if (stat(path, &sb) != 0)
            continue; /* deleted while we looked */
        size_t klen = strlen(key);
        if (S_ISDIR(sb.st_mode)) {
            /* enter when the directory's keys can still match the prefix */
            size_t m = klen < plen ? klen : plen;
            if (strncmp(key, prefix, m) != 0 || (klen < plen && prefix[klen] != '/'))
                continue;
            key[klen] = '/';
            key[klen + 1] = '\0';
            rc = walk(s, path, key, prefix, keys, n, cap, depth + 1);
        } else if (S_ISREG(sb.st_mode) && strncmp(key, prefix, plen) == 0 &&
                   edl_storage_key_valid(key)) {
            rc = storage_list_add(keys, n, cap, key, klen);
        }
    }
    closedir(d);
    return rc;
}

static int file_list(edl_storage *s, const char *prefix, char ***keys, size_t *n, size_t *cap)
{
    file_store *f = s->impl;
    return walk(s, f->root, "", prefix, keys, n, cap, 0);
}

static int file_delete(edl_storage *s, const char *key)
{
    file_store *f = s->impl;
    char path[PATH_MAX];
    key_path(s, key, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
        return storage_fail(s, errno_code(errno), "cannot delete %s: %s", path, strerror(errno));
    /* Remove directories left empty, up to the root: a checkpoint directory disappears with
     * its last object, as a prefix does on S3. rmdir fails harmlessly on a non-empty one. */
    size_t rootlen = strlen(f->root);
    for (char *slash = strrchr(path, '/'); slash && (size_t)(slash - path) > rootlen;
         slash = strrchr(path, '/')) {
        *slash = '\0';
        if (rmdir(path) != 0)
            break;
    }
    return 0;
}

const storage_backend storage_file_backend = {
    .scheme = "file",
    .open = file_open,
    .close = file_close,
    .put = file_put,
    .get_stream = file_get_stream,
    .get_into = file_get_into,
    .stat_key = file_stat,
    .list = file_list,
    .del = file_delete,
};
