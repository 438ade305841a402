/* state.c: the state files that `edl run` leaves for `edl scale/status/stop` in other
 * terminals, the job secret it makes for each run, and the directories of a run (its etcd's
 * certificates, its agents' own directories), in a directory that only this user can write.
 *
 * The directory is $EDL_STATE_DIR, else $XDG_RUNTIME_DIR/edl, else /tmp/edl-<uid>. Before it is
 * used it must be a real directory (not a link), owned by this user, that group and others
 * cannot write: a predictable name in /tmp could otherwise be prepared by someone else to swap
 * or redirect what we write. Others may read it (mode 0755, as sshd accepts ~/.ssh): every file
 * in it is made 0600 and every directory 0700, so a listing of names is all they get. Files in
 * it are opened without following links. edl run checks it before it starts anything
 * (cli_state_check) and refuses to run when it is unusable. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "edl/secret.h"
#include "edl/etcd_server.h"
#include "edl/proc.h"

void cli_state_dir(char *buf, size_t n)
{
    const char *d = getenv("EDL_STATE_DIR"), *x = getenv("XDG_RUNTIME_DIR");
    if (d && *d)
        snprintf(buf, n, "%s", d);
    else if (x && *x)
        snprintf(buf, n, "%s/edl", x);
    else
        snprintf(buf, n, "/tmp/edl-%u", (unsigned)getuid());
}

/* What is wrong with the directory for our use ("" when nothing). */
static const char *dir_problem(const struct stat *st)
{
    if (S_ISLNK(st->st_mode))
        return "a symbolic link";
    if (!S_ISDIR(st->st_mode))
        return "not a directory";
    if (st->st_uid != getuid())
        return "a directory of another user";
    if (st->st_mode & 022)
        return "a directory writable by others";
    return "";
}

int cli_private_dir(const char *dir, bool create, char *why, size_t whylen)
{
    if (create && mkdir(dir, 0700) != 0 && errno != EEXIST)
        return edl_errf(why, whylen, EDL_EIO, "cannot create %s: %s", dir, strerror(errno));
    struct stat st;
    if (lstat(dir, &st) != 0)
        return edl_errf(why, whylen, errno == ENOENT ? EDL_ENOTFOUND : EDL_EIO, "%s: %s", dir,
                        strerror(errno));
    const char *problem = dir_problem(&st);
    if (*problem)
        return edl_errf(why, whylen, EDL_EIO, "%s is not a private directory of this user (%s: "
                        "owner %u, mode %03o): not using it; %s", dir, problem,
                        (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777),
                        S_ISDIR(st.st_mode) && st.st_uid == getuid() ? "chmod go-w it"
                                                                     : "remove it");
    return 0;
}

/* The state directory, created if asked and checked: 0, or an EDL_E* code with the reason in
 * why (EDL_ENOTFOUND: there is none, so no local job). */
static int private_dir(bool create, char *dir, size_t n, char *why, size_t whylen)
{
    cli_state_dir(dir, n);
    int rc = cli_private_dir(dir, create, why, whylen);
    size_t len = strnlen(why, whylen);
    if (rc == EDL_ENOTFOUND)
        snprintf(why, whylen, "no local job: no state directory %s", dir);
    else if (rc && len + 1 < whylen)
        snprintf(why + len, whylen - len, ", or set EDL_STATE_DIR to a directory of yours");
    return rc;
}

int cli_state_check(char *why, size_t whylen)
{
    char dir[512];
    return private_dir(true, dir, sizeof dir, why, whylen);
}

/* A new directory (mode 0700) <state dir>/<job>.<kind>.XXXXXX: its path in out. */
static int run_dir(const char *job, const char *kind, char *out, size_t n, char *why,
                   size_t whylen)
{
    char dir[512];
    int rc = private_dir(true, dir, sizeof dir, why, whylen);
    if (rc)
        return rc;
    snprintf(out, n, "%s/%s.%s.XXXXXX", dir, job, kind);
    if (!mkdtemp(out)) /* mode 0700 */
        return edl_errf(why, whylen, EDL_EIO, "cannot create a directory %s: %s", out,
                        strerror(errno));
    return 0;
}

int cli_state_tls_dir(const char *job, char *out, size_t n, char *why, size_t whylen)
{
    return run_dir(job, "tls", out, n, why, whylen);
}

int cli_state_scratch_dir(const char *job, char *out, size_t n, char *why, size_t whylen)
{
    return run_dir(job, "run", out, n, why, whylen);
}

/* Remove path and, for a directory, what it holds down to depth levels; links are removed,
 * never followed. */
static void remove_tree(int at, const char *name, int depth)
{
    if (unlinkat(at, name, 0) == 0 || errno != EISDIR || depth <= 0)
        return;
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d && fd >= 0)
        close(fd);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            remove_tree(dirfd(d), e->d_name, depth - 1);
    if (d)
        closedir(d);
    unlinkat(at, name, AT_REMOVEDIR);
}

void cli_state_scratch_remove(const char *dir)
{
    remove_tree(AT_FDCWD, dir, 2); /* the run's directory / an agent's / its error file */
}

void cli_state_tls_remove(const char *dir)
{
    static const char *const files[] = {EDL_ETCD_TLS_CA, EDL_ETCD_TLS_SERVER_CERT,
                                        EDL_ETCD_TLS_SERVER_KEY, EDL_ETCD_TLS_CLIENT_CERT,
                                        EDL_ETCD_TLS_CLIENT_KEY};
    char path[PATH_MAX];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void state_path(const char *dir, const char *job, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s.endpoints", dir, job);
}

/* The settings as text: one NAME=value line per environment name of edl/etcd.h. */
static char *state_text(const edl_etcd_config *etcd)
{
    char **env = NULL, *text = NULL;
    size_t len = 1;
    if (edl_etcd_config_env(etcd, &env) != 0)
        return NULL;
    for (char **e = env; *e; e++)
        len += strlen(*e) + 1;
    if ((text = malloc(len)) != NULL) {
        text[0] = '\0';
        for (char **e = env; *e; e++)
            strcat(strcat(text, *e), "\n");
    }
    edl_env_free(env);
    return text;
}

int cli_state_write(const char *job, const edl_etcd_config *etcd, char *why, size_t whylen)
{
    char dir[512], path[700], tmp[720];
    int rc = private_dir(true, dir, sizeof dir, why, whylen);
    if (rc)
        return rc;
    char *text = state_text(etcd);
    if (!text)
        return edl_errf(why, whylen, EDL_ENOMEM, "out of memory");
    state_path(dir, job, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        free(text);
        return edl_errf(why, whylen, EDL_EIO, "%s: %s", tmp, strerror(errno));
    }
    size_t len = strlen(text);
    bool ok = write(fd, text, len) == (ssize_t)len;
    free(text);
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) { /* rename replaces a link at path, never follows it */
        int e = errno;
        unlink(tmp);
        return edl_errf(why, whylen, EDL_EIO, "%s: %s", path, strerror(e));
    }
    return 0;
}

/* Split text into its lines: a NULL-terminated list pointing into text (which it changes). */
static void split_lines(char *text, char **lines, size_t max)
{
    size_t n = 0;
    for (char *save = NULL, *l = strtok_r(text, "\r\n", &save); l && n + 1 < max;
         l = strtok_r(NULL, "\r\n", &save))
        lines[n++] = l;
    lines[n] = NULL;
}

int cli_state_read(const char *job, edl_etcd_config *etcd, char *why, size_t whylen)
{
    char dir[512], path[700], text[8192], *lines[16];
    int rc = private_dir(false, dir, sizeof dir, why, whylen);
    if (rc)
        return rc;
    state_path(dir, job, path, sizeof path);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? edl_errf(why, whylen, EDL_ENOTFOUND, "no local job of that "
                                          "name: %s", path)
                               : edl_errf(why, whylen, EDL_EIO, "%s: cannot be read", path);
    ssize_t got = read(fd, text, sizeof text - 1);
    close(fd);
    if (got <= 0)
        return edl_errf(why, whylen, EDL_EIO, "%s is empty or unreadable", path);
    text[got] = '\0';
    split_lines(text, lines, sizeof lines / sizeof lines[0]);
    char err[600];
    if (edl_etcd_config_from_entries(etcd, lines, err, sizeof err) != 0)
        return edl_errf(why, whylen, EDL_EIO, "%s: %s", path, err);
    return 0;
}

bool cli_state_exists(const char *job)
{
    char dir[512], path[700], why[8];
    if (private_dir(false, dir, sizeof dir, why, sizeof why) != 0)
        return false;
    state_path(dir, job, path, sizeof path);
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void cli_state_remove(const char *job)
{
    char dir[512], path[700], why[8];
    if (private_dir(false, dir, sizeof dir, why, sizeof why) != 0)
        return;
    state_path(dir, job, path, sizeof path);
    unlink(path);
}

int cli_state_new_secret(const char *job, char *path, size_t n, char *why, size_t whylen)
{
    char dir[512];
    int rc = private_dir(true, dir, sizeof dir, why, whylen);
    if (rc)
        return rc;
    snprintf(path, n, "%s/%s-%d.secret", dir, job, (int)getpid());
    return edl_job_secret_generate(path, why, whylen);
}

void cli_state_drop_secret(const char *path)
{
    unlink(path);
}

/* ---- the launcher's lock --------------------------------------------------------------------
 * <state dir>/<job>.lock holds the pid of the launcher that runs the job here, under flock
 * for the launcher's whole life: the kernel drops the lock when the launcher dies, however it
 * dies, so a lock nobody holds marks what is left in the directory as stale. */

static void lock_path(const char *dir, const char *job, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s.lock", dir, job);
}

/* The pid in a lock file (0: none). */
static long lock_pid(int fd)
{
    char buf[32];
    ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
    buf[got > 0 ? got : 0] = '\0';
    return atol(buf);
}

/* Take the lock: the file at path, still the one there once locked. 0, or EDL_EBUSY (a live
 * holder, its pid in *pid) or EDL_EIO (errno). */
static int take_lock(const char *path, int *out, long *pid)
{
    for (int tries = 0; tries < 50; tries++) {
        int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
            return EDL_EIO;
        *pid = lock_pid(fd);
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            close(fd);
            if (errno != EWOULDBLOCK)
                return EDL_EIO;
            if (tries >= 4) /* not a moment's probe by edl status (cli_state_launcher) */
                return EDL_EBUSY;
            usleep(20 * 1000);
            continue;
        }
        struct stat held, now;
        if (fstat(fd, &held) == 0 && lstat(path, &now) == 0 && held.st_ino == now.st_ino &&
            held.st_dev == now.st_dev) {
            *out = fd;
            return 0;
        }
        close(fd); /* its last holder removed it meanwhile: lock the one there now */
    }
    return EDL_EIO;
}

int cli_state_lock(const char *job, int *fd, long *stale_pid, char *why, size_t whylen)
{
    char dir[512], path[700];
    *fd = -1;
    *stale_pid = 0;
    int rc = private_dir(true, dir, sizeof dir, why, whylen);
    if (rc)
        return rc;
    lock_path(dir, job, path, sizeof path);
    long pid = 0;
    rc = take_lock(path, fd, &pid);
    if (rc == EDL_EBUSY)
        return edl_errf(why, whylen, rc, "job \"%s\" is already running on this machine under "
                        "edl run (pid %ld; its lock %s): stop it first (edl stop %s) or choose "
                        "another --job", job, pid, path, job);
    if (rc)
        return edl_errf(why, whylen, rc, "%s: %s", path, strerror(errno));
    char text[32];
    int len = snprintf(text, sizeof text, "%d\n", (int)getpid());
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, text, (size_t)len, 0) != len) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return edl_errf(why, whylen, EDL_EIO, "%s: %s", path, strerror(e));
    }
    if (cli_state_exists(job)) /* a launcher died without cleaning up: what it left is stale */
        *stale_pid = pid > 0 ? pid : -1;
    return 0;
}

void cli_state_unlock(const char *job, int fd)
{
    char dir[512], path[700], why[8];
    if (fd < 0)
        return;
    if (private_dir(false, dir, sizeof dir, why, sizeof why) == 0) {
        lock_path(dir, job, path, sizeof path);
        unlink(path); /* while still held: a launcher that opened it retries on the new file */
    }
    close(fd);
}

cli_launcher cli_state_launcher(const char *job, long *pid)
{
    char dir[512], path[700], why[8];
    *pid = 0;
    if (private_dir(false, dir, sizeof dir, why, sizeof why) != 0)
        return CLI_LAUNCHER_UNKNOWN;
    lock_path(dir, job, path, sizeof path);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? CLI_LAUNCHER_NONE : CLI_LAUNCHER_UNKNOWN;
    *pid = lock_pid(fd);
    cli_launcher r = CLI_LAUNCHER_GONE;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0)
        r = errno == EWOULDBLOCK ? CLI_LAUNCHER_ALIVE : CLI_LAUNCHER_UNKNOWN;
    close(fd); /* drops our shared lock at once */
    return r;
}

/* ---- what a launcher that is gone left ---------------------------------------------------- */

/* name is <job>.<kind>.XXXXXX, a directory mkdtemp made for the job. */
static bool run_dir_of(const char *name, const char *job, const char *kind)
{
    size_t jl = strlen(job), kl = strlen(kind);
    return strncmp(name, job, jl) == 0 && name[jl] == '.' && strncmp(name + jl + 1, kind, kl) == 0 &&
           name[jl + 1 + kl] == '.' && strlen(name + jl + kl + 2) == 6 &&
           !strchr(name + jl + kl + 2, '.');
}

void cli_state_clean_stale(const char *job, long stale_pid)
{
    char dir[512], why[8], secret[700];
    if (private_dir(false, dir, sizeof dir, why, sizeof why) != 0)
        return;
    if (stale_pid > 0) {
        snprintf(secret, sizeof secret, "%s/%s-%ld.secret", dir, job, stale_pid);
        unlink(secret);
    }
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (run_dir_of(e->d_name, job, "tls") || run_dir_of(e->d_name, job, "run"))
            remove_tree(dirfd(d), e->d_name, 2);
    if (d)
        closedir(d);
}

int cli_state_jobs(char names[][EDL_NAME_MAX + 1], size_t max, size_t *n)
{
    char dir[512], why[8];
    *n = 0;
    if (private_dir(false, dir, sizeof dir, why, sizeof why) != 0)
        return EDL_EIO;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name), sl = strlen(".endpoints");
        if (len <= sl || len - sl > EDL_NAME_MAX || strcmp(e->d_name + len - sl, ".endpoints"))
            continue;
        char job[EDL_NAME_MAX + 1];
        snprintf(job, sizeof job, "%.*s", (int)(len - sl), e->d_name);
        long pid;
        if (edl_name_valid(job) && cli_state_launcher(job, &pid) != CLI_LAUNCHER_GONE) {
            if (*n < max)
                snprintf(names[*n], EDL_NAME_MAX + 1, "%s", job);
            (*n)++;
        }
    }
    if (d)
        closedir(d);
    return 0;
}
