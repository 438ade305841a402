/* state.c: the state files that `edl run` leaves for `edl scale/status/stop` in other
 * terminals, and the job secret it makes for each run, in a directory only this user can use.
 *
 * The directory is $EDL_STATE_DIR, else $XDG_RUNTIME_DIR/edl, else /tmp/edl-<uid>. Before it is
 * used it must be a real directory (not a link), owned by this user, with no access for group or
 * others: a predictable name in /tmp could otherwise be prepared by someone else to read, swap
 * or redirect what we write. Files in it are opened without following links. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* The state directory, created if asked and checked: 0, or EDL_EIO with the reason in why. */
static int private_dir(bool create, char *dir, size_t n, char *why, size_t whylen)
{
    cli_state_dir(dir, n);
    if (create && mkdir(dir, 0700) != 0 && errno != EEXIST)
        return edl_errf(why, whylen, EDL_EIO, "cannot create %s: %s", dir, strerror(errno));
    struct stat st;
    if (lstat(dir, &st) != 0)
        return edl_errf(why, whylen, EDL_EIO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        return edl_errf(why, whylen, EDL_EIO, "%s is not a private directory of this user (%s, "
                        "owner %u, mode %03o): not using it; remove it or set EDL_STATE_DIR",
                        dir, S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ?
                        "a directory" : "not a directory", (unsigned)st.st_uid,
                        (unsigned)(st.st_mode & 0777));
    return 0;
}

int cli_state_tls_dir(const char *job, char *out, size_t n, char *why, size_t whylen)
{
    char dir[512];
    const char *tmp = getenv("TMPDIR");
    int rc = private_dir(true, dir, sizeof dir, why, whylen);
    if (rc)
        snprintf(dir, sizeof dir, "%s", tmp && *tmp ? tmp : "/tmp");
    snprintf(out, n, "%s/%s.tls.XXXXXX", dir, job);
    if (!mkdtemp(out)) /* mode 0700 */
        return edl_errf(why, whylen, EDL_EIO, "cannot create a directory %s: %s", out,
                        strerror(errno));
    return 0;
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
        return edl_errf(why, whylen, EDL_ENOTFOUND, errno == ENOENT ? "no local job of that name: "
                        "%s" : "%s: cannot be read", path);
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

int cli_state_new_secret(const char *job, char *path, size_t n, bool *tmpdir, char *why,
                         size_t whylen)
{
    char dir[512];
    *tmpdir = private_dir(true, dir, sizeof dir, why, whylen) != 0;
    if (*tmpdir) { /* the state directory is refused: a private one of our own instead */
        snprintf(dir, sizeof dir, "/tmp/edl-secret-XXXXXX");
        if (!mkdtemp(dir))
            return edl_errf(why, whylen, EDL_EIO, "mkdtemp: %s", strerror(errno));
    }
    snprintf(path, n, "%s/%s-%d.secret", dir, job, (int)getpid());
    int rc = edl_job_secret_generate(path, why, whylen);
    if (rc && *tmpdir)
        rmdir(dir);
    return rc;
}

void cli_state_drop_secret(const char *path, bool tmpdir)
{
    unlink(path);
    const char *slash = strrchr(path, '/');
    if (tmpdir && slash) {
        char dir[512];
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
        rmdir(dir);
    }
}
