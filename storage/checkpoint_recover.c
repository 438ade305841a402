/* checkpoint_recover.c: a job's checkpoints found from the store itself, and moved aside.
 *
 * The etcd pointer only speeds up finding the newest checkpoint: a job run again after its
 * etcd keys went (a new `edl run`, a TrainingJob deleted and applied again, an etcd that lost
 * its data) rebuilds it from a listing of the URI. A directory ckpt-<step>-g<gen>/ that holds
 * a manifest.json is complete: the committer writes the manifest only after every rank's
 * shards are stored and checked (a corrupt one is passed over by load, as ever). */
#define _GNU_SOURCE
#include "checkpoint_internal.h"
#include "edl/job.h"
#include "edl/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MANIFEST_SUFFIX "/manifest.json"

/* Newest first: step, then generation. */
static int newer_first(const void *a, const void *b)
{
    const ckpt_pointer_entry *x = a, *y = b;
    if (x->step != y->step)
        return x->step > y->step ? -1 : 1;
    return x->generation > y->generation ? -1 : x->generation < y->generation;
}

/* The complete checkpoints among the listed keys: every "<dir>/manifest.json" of ours. */
static int complete_dirs(char **keys, size_t n, ckpt_pointer *p)
{
    p->entries = calloc(n ? n : 1, sizeof *p->entries);
    if (!p->entries)
        return EDL_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const char *slash = strchr(keys[i], '/');
        ckpt_pointer_entry *e = &p->entries[p->n];
        if (slash && strcmp(slash, MANIFEST_SUFFIX) == 0 &&
            ckpt_dir_parse(keys[i], (size_t)(slash - keys[i]), &e->step, &e->generation)) {
            ckpt_dir_name(e->step, e->generation, e->dir, sizeof e->dir);
            p->n++;
        }
    }
    qsort(p->entries, p->n, sizeof *p->entries, newer_first);
    return 0;
}

int ckpt_pointer_from_store(edl_storage *st, const char *uri, int keep, char **doc,
                            ckpt_pointer_entry *newest, size_t *found, char *err, size_t errlen)
{
    *doc = NULL;
    *found = 0;
    char **keys = NULL;
    size_t n = 0;
    int rc = edl_storage_list(st, "ckpt-", &keys, &n);
    if (rc != 0)
        return edl_errf(err, errlen, rc, "cannot list %s to find the job's checkpoints: %s", uri,
                        edl_storage_errmsg(st));
    ckpt_pointer all = {0};
    rc = complete_dirs(keys, n, &all);
    edl_storage_list_free(keys, n);
    if (rc == 0 && all.n == 0)
        rc = EDL_ENOTFOUND;
    if (rc == 0) {
        ckpt_pointer older = {.entries = all.entries + 1, .n = all.n - 1};
        *doc = ckpt_pointer_doc(uri, &older, all.entries[0].step, all.entries[0].generation, keep);
        rc = *doc ? 0 : EDL_ENOMEM;
        *newest = all.entries[0];
        *found = all.n;
    }
    ckpt_pointer_clear(&all);
    return rc;
}

/* ---- edl_ckpt_set_aside ------------------------------------------------------------------- */

/* file:///dir: rename each ckpt-* directory into dir/<aside>/ (one rename each, whatever the
 * checkpoints' size). */
static int move_file_dirs(edl_storage *st, const char *root, const char *aside, size_t *moved,
                          char *err, size_t errlen)
{
    char **keys = NULL;
    size_t n = 0;
    int rc = edl_storage_list(st, "ckpt-", &keys, &n);
    if (rc != 0)
        return edl_errf(err, errlen, rc, "cannot list %s: %s", edl_storage_uri(st),
                        edl_storage_errmsg(st));
    char *to = NULL;
    if (asprintf(&to, "%s/%s", root, aside) < 0)
        to = NULL;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const char *slash = strchr(keys[i], '/');
        size_t len = slash ? (size_t)(slash - keys[i]) : strlen(keys[i]);
        if (i > 0 && strncmp(keys[i - 1], keys[i], len) == 0 && keys[i - 1][len] == '/')
            continue; /* the same directory as the key before */
        char *src = NULL, *dst = NULL;
        if (!to || asprintf(&src, "%s/%.*s", root, (int)len, keys[i]) < 0 ||
            asprintf(&dst, "%s/%.*s", to, (int)len, keys[i]) < 0)
            rc = EDL_ENOMEM;
        else if ((mkdir(to, 0700) != 0 && errno != EEXIST) || rename(src, dst) != 0)
            rc = edl_errf(err, errlen, EDL_EIO, "cannot move %s to %s: %s", src, dst,
                          strerror(errno));
        else
            (*moved)++;
        free(src);
        free(dst);
    }
    free(to);
    edl_storage_list_free(keys, n);
    return rc;
}

/* Delete the pointer, so that nothing names the checkpoints moved aside. */
static int delete_pointer(const edl_ckpt_config *cfg, char *err, size_t errlen)
{
    edl_job_keys k;
    int rc = edl_job_keys_init(&k, cfg->prefix ? cfg->prefix : EDL_DEFAULT_PREFIX, cfg->job);
    if (rc != 0)
        return edl_errf(err, errlen, rc, "job \"%s\": not a valid job name", cfg->job);
    rc = edl_etcd_delete(cfg->etcd, edl_str(k.checkpoint), NULL, NULL);
    if (rc != 0)
        edl_errf(err, errlen, rc, "cannot delete the checkpoint pointer %s: %s", k.checkpoint,
                 edl_etcd_errmsg(cfg->etcd));
    edl_job_keys_clear(&k);
    return rc;
}

int edl_ckpt_set_aside(const edl_ckpt_config *cfg, char *where, size_t wherelen, size_t *moved,
                       char *err, size_t errlen)
{
    if (!cfg || !cfg->uri || !cfg->etcd || !cfg->job || !moved)
        return edl_errf(err, errlen, EDL_EINVAL, "set aside: uri, etcd and job are required");
    *moved = 0;
    if (strncmp(cfg->uri, "file://", 7) != 0)
        return edl_errf(err, errlen, EDL_ENOTSUP, "cannot move the checkpoints of %s aside: only "
                        "file:// URIs can be (move or delete its ckpt-* objects yourself, e.g. "
                        "aws s3 rm --recursive, then run again)", cfg->uri);
    edl_storage_config sc = ckpt_store_config(cfg);
    edl_storage *st;
    int rc = edl_storage_open(&sc, &st, err, errlen);
    if (rc != 0)
        return rc;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char aside[64];
    strftime(aside, sizeof aside, "previous-%Y%m%dT%H%M%SZ", &tm);
    rc = delete_pointer(cfg, err, errlen);
    if (rc == 0)
        rc = move_file_dirs(st, cfg->uri + 7, aside, moved, err, errlen);
    if (where)
        snprintf(where, wherelen, "%s/%s", cfg->uri, aside);
    edl_storage_close(st);
    return rc;
}
