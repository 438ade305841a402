/* logs.c: the output of `edl run`'s children kept by pod and rank, and `edl logs` that reads it.
 *
 * While it runs a job, edl run writes every line a child prints (an agent's own lines and its
 * trainer's stdout and stderr, which share the agent's pipe) to a file named after the pod and
 * what the pod is in the newest generation the launcher has seen: <pod>.rank<N>.log for a
 * member of rank N, <pod>.server<N>.log for a parameter server, <pod>.log for a pod without a
 * rank (standby, teacher, waiting) and for the job server. The files are in
 * <state dir>/<job>.logs (0700, files 0600), kept after the run ends and emptied when the job
 * runs again. `edl logs JOB [--rank N] [--pod P] [--follow]` prints them, as `kubectl logs`
 * prints a pod's. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "edl/log.h"

#define LOGS_MAX 4096 /* files one `edl logs` looks at */

int cli_logs_dir(const char *job, bool create, char *out, size_t n, char *why, size_t whylen)
{
    char dir[512];
    cli_state_dir(dir, sizeof dir);
    int rc = cli_private_dir(dir, create, why, whylen);
    if (!rc) {
        snprintf(out, n, "%s/%s.logs", dir, job);
        rc = cli_private_dir(out, create, why, whylen);
    }
    if (rc != EDL_ENOTFOUND || create)
        return rc;
    return edl_errf(why, whylen, rc, "no logs of job \"%s\" on this machine (no %s/%s.logs): "
                    "edl run writes them while it runs the job here; check the name", job, dir,
                    job);
}

int cli_logs_reset(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return EDL_EIO;
    }
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.')
            unlinkat(dirfd(d), e->d_name, 0); /* a link is removed, never followed */
    closedir(d);
    return 0;
}

void cli_logs_path(const char *dir, const char *pod, const char *kind, int num, char *out,
                   size_t n)
{
    if (kind)
        snprintf(out, n, "%s/%s.%s%d.log", dir, pod, kind, num);
    else
        snprintf(out, n, "%s/%s.log", dir, pod);
}

/* ---- edl logs ---------------------------------------------------------------------------- */

typedef struct log_file {
    char name[NAME_MAX + 1];
    char pod[NAME_MAX + 1];
    int rank;          /* -1: not a member's (a server's, or no rank) */
    char what[32];     /* "rank 3", "server 1", "" */
    int64_t mtime_ns;
    off_t done;        /* bytes printed so far */
} log_file;

/* Split a file name of cli_logs_path into pod and label: false when it is not one. */
static bool parse_name(const char *name, log_file *f)
{
    size_t len = strlen(name);
    if (len < 5 || strcmp(name + len - 4, ".log") != 0 || len > NAME_MAX)
        return false;
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    snprintf(f->pod, sizeof f->pod, "%.*s", (int)(len - 4), name);
    f->rank = -1;
    char *dot = strrchr(f->pod, '.');
    static const char *const kinds[] = {"rank", "server"};
    for (size_t k = 0; dot && k < 2; k++) {
        size_t kl = strlen(kinds[k]);
        char *end;
        if (strncmp(dot + 1, kinds[k], kl) != 0 || !(dot[1 + kl] >= '0' && dot[1 + kl] <= '9'))
            continue;
        long v = strtol(dot + 1 + kl, &end, 10);
        if (*end || v > INT_MAX)
            continue;
        *dot = '\0';
        snprintf(f->what, sizeof f->what, "%s %ld", kinds[k], v);
        f->rank = k == 0 ? (int)v : -1;
        break;
    }
    return true;
}

typedef struct logs_opts {
    const char *job;
    int rank;          /* -1: any */
    const char *pod;   /* NULL: any */
    bool follow;
    char dir[PATH_MAX];
} logs_opts;

static int by_mtime(const void *a, const void *b)
{
    const log_file *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns)
        return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The files of the directory that the options select, oldest change first (a rank that moved
 * between pods: its last holder last); files already in have (by name) keep their offsets. */
static size_t list_files(const logs_opts *o, log_file *v, size_t have, size_t max,
                         char *ranks, size_t rlen)
{
    DIR *d = opendir(o->dir);
    size_t n = have, used = 0;
    if (ranks)
        ranks[0] = '\0';
    for (struct dirent *e; d && (e = readdir(d));) {
        log_file f;
        struct stat st;
        if (!parse_name(e->d_name, &f) || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
            !S_ISREG(st.st_mode))
            continue;
        if (ranks && f.rank >= 0 && used < rlen)
            used += (size_t)snprintf(ranks + used, rlen - used, " %d", f.rank);
        if ((o->rank >= 0 && f.rank != o->rank) || (o->pod && strcmp(o->pod, f.pod) != 0))
            continue;
        f.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        size_t i = 0;
        while (i < have && strcmp(v[i].name, f.name) != 0)
            i++;
        if (i < have)
            v[i].mtime_ns = f.mtime_ns;
        else if (n < max)
            v[n++] = f;
    }
    if (d)
        closedir(d);
    qsort(v + have, n - have, sizeof *v, by_mtime);
    return n;
}

/* Print what was added to f since the last call, under a header when another file was printed
 * last and more than one is shown ("==> pod P, rank N <==", as tail does). */
static void print_new(const logs_opts *o, log_file *f, bool headers, const log_file **last)
{
    char path[PATH_MAX + NAME_MAX + 2];
    snprintf(path, sizeof path, "%s/%s", o->dir, f->name);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[65536];
    ssize_t r;
    while ((r = pread(fd, buf, sizeof buf, f->done)) > 0) {
        if (headers && *last != f)
            printf("%s==> pod %s%s%s <==\n", *last ? "\n" : "", f->pod, *f->what ? ", " : "",
                   f->what);
        *last = f;
        fwrite(buf, 1, (size_t)r, stdout);
        f->done += r;
    }
    close(fd);
    fflush(stdout);
}

static const char logs_usage[] =
    "Usage: edl logs JOB [--rank N] [--pod POD] [--follow]\n"
    "\n"
    "Prints what the trainers of a job that edl run runs (or ran) on this machine wrote to\n"
    "stdout and stderr, with their agents' own lines, as kubectl logs does for a pod. edl run\n"
    "keeps a file per pod and rank in <state dir>/JOB.logs (the rank a pod holds changes with\n"
    "the generations), kept after the job ends and emptied when it runs again. Several files\n"
    "are printed one after the other, oldest change first, each under a \"==> pod P, rank N <==\"\n"
    "header.\n"
    "\n"
    "Options:\n"
    "  --rank N     only rank N (every pod that held it)\n"
    "  --pod POD    only this pod (all its ranks; `jobserver` for the job server)\n"
    "  -f, --follow keep printing what is added until the job's edl run exits\n"
    "  -h, --help   this text\n"
    "\n"
    "Exit codes: 0 printed, 1 no logs of the job, rank or pod here, 2 usage.\n";

static int parse_logs(int argc, char **argv, logs_opts *o)
{
    static const struct option opts[] = {{"rank", required_argument, NULL, 'r'},
                                         {"pod", required_argument, NULL, 'p'},
                                         {"follow", no_argument, NULL, 'f'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    o->rank = -1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "fh", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'r':
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || errno || v < 0 || v > INT_MAX) {
                fprintf(stderr, "edl logs: --rank %s: expected a rank, a number from 0\n",
                        optarg);
                return -1;
            }
            o->rank = (int)v;
            break;
        case 'p': o->pod = optarg; break;
        case 'f': o->follow = true; break;
        case 'h': printf("%s", logs_usage); exit(0);
        default: fprintf(stderr, "%s", logs_usage); return -1;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "edl logs: %s: edl logs JOB [--rank N] [--pod POD] [--follow] (see "
                        "--help)\n", optind < argc ? "one job only" : "which job?");
        return -1;
    }
    o->job = argv[optind];
    if (!edl_name_valid(o->job)) {
        fprintf(stderr, "edl logs: job name \"%s\" is not valid: use 1-128 of [A-Za-z0-9._-], "
                        "not starting with '.' or '-'\n", o->job);
        return -1;
    }
    return 0;
}

/* Print the selected files; with --follow, what is added to them (and new ones) until the
 * job's launcher is gone. */
static int print_logs(logs_opts *o, log_file *v)
{
    const log_file *last = NULL;
    char ranks[256];
    size_t n = list_files(o, v, 0, LOGS_MAX, ranks, sizeof ranks);
    if (n == 0) {
        if (o->rank >= 0)
            fprintf(stderr, "edl logs: job \"%s\" has no logs of rank %d in %s (ranks with "
                            "logs:%s)\n", o->job, o->rank, o->dir, *ranks ? ranks : " none");
        else
            fprintf(stderr, "edl logs: job \"%s\" has no logs%s%s in %s (pods are named "
                            "%s-N; `ls %s` shows the files)\n", o->job, o->pod ? " of pod " : "",
                    o->pod ? o->pod : "", o->dir, o->job, o->dir);
        return EDL_EXIT_FAILED;
    }
    for (;;) {
        long pid;
        bool more = o->follow && cli_state_launcher(o->job, &pid) == CLI_LAUNCHER_ALIVE;
        for (size_t i = 0; i < n; i++)
            print_new(o, &v[i], n > 1, &last);
        if (!more)
            return 0;
        usleep(200 * 1000);
        n = list_files(o, v, n, LOGS_MAX, NULL, 0);
    }
}

int cli_logs(int argc, char **argv)
{
    logs_opts o = {0};
    if (parse_logs(argc, argv, &o) != 0)
        return EDL_EXIT_USAGE;
    char why[1024];
    int rc = cli_logs_dir(o.job, false, o.dir, sizeof o.dir, why, sizeof why);
    if (rc) {
        fprintf(stderr, "edl logs: %s\n", why);
        return rc == EDL_ENOTFOUND ? EDL_EXIT_FAILED : EDL_EXIT_USAGE;
    }
    log_file *v = calloc(LOGS_MAX, sizeof *v);
    if (!v) {
        fprintf(stderr, "edl logs: out of memory\n");
        return EDL_EXIT_USAGE;
    }
    rc = print_logs(&o, v);
    free(v);
    return rc;
}
