/* checkpoint.c: PS checkpoints through edl/checkpoint.h. A save (SAVE, from edl_ps_save) makes
 * each server one rank of the checkpoint: per table, one checkpoint shard "table-<id>" holding
 * the virtual shards it owns,
 *   table config(PS_CONFIG_BYTES) n(4) 0(4) then n times: shard(4) 0(4) length(8) the bytes
 *   of ps_table_shard_export,
 * snapshotted under the table's shard locks and uploaded in the background; rank 0 commits.
 * A restore reads every rank's file of a table it restores (once, its digest checked as it
 * arrives) and takes the shards this server needs, so a checkpoint loads on any number of
 * servers; the shards of a corrupt file come from the next older checkpoint. Each shard is
 * saved by its owner only. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edl/log.h"
#include "edl/wire.h"
#include "internal.h"
#include "server.h"

#define ENTRY_BYTES 16

int ps_ckpt_init(edl_ps_server *s, const edl_ckpt_config *cfg)
{
    pthread_mutex_init(&s->cp.mu, NULL);
    if (!cfg)
        return 0;
    s->cp.cfg = *cfg;
    s->cp.cfg.uri = cfg->uri ? strdup(cfg->uri) : NULL;
    s->cp.cfg.job = cfg->job ? strdup(cfg->job) : NULL;
    s->cp.cfg.prefix = cfg->prefix ? strdup(cfg->prefix) : NULL;
    s->cp.on = true;
    if (!s->cp.cfg.uri || !s->cp.cfg.job || (cfg->prefix && !s->cp.cfg.prefix))
        return EDL_ENOMEM;
    return 0;
}

bool ps_ckpt_enabled(const edl_ps_server *s)
{
    return s->cp.on;
}

void ps_ckpt_close(edl_ps_server *s)
{
    for (size_t i = 0; i < sizeof s->cp.saves / sizeof *s->cp.saves; i++)
        if (s->cp.saves[i]) {
            edl_ckpt_wait(s->cp.saves[i], -1);
            edl_ckpt_save_free(s->cp.saves[i]);
        }
    edl_ckpt_close(s->cp.ck);
    free((char *)s->cp.cfg.uri), free((char *)s->cp.cfg.job), free((char *)s->cp.cfg.prefix);
    pthread_mutex_destroy(&s->cp.mu);
}

/* A checkpoint handle for rank of world (under s->cp.mu). */
static int ckpt_for(edl_ps_server *s, int rank, int world, char *why, size_t whylen)
{
    if (s->cp.ck && s->cp.rank == rank && s->cp.world == world)
        return 0;
    edl_ckpt_close(s->cp.ck); /* waits for its uploads */
    s->cp.ck = NULL;
    edl_ckpt_config c = s->cp.cfg;
    c.rank = rank;
    c.world_size = world;
    c.committer_rank = 0;
    c.verify_on_load = false; /* the restore's one read of each file checks it */
    int rc = edl_ckpt_open(&c, &s->cp.ck, why, whylen);
    s->cp.rank = rank, s->cp.world = world;
    return rc;
}

/* The file of one table: the shards this server owns (all of them without a map). */
static uint8_t *table_file(edl_ps_server *s, uint16_t id, ps_table *t, size_t *len)
{
    const edl_ps_table_config *cfg = ps_table_config(t);
    size_t cap = PS_CONFIG_BYTES + 8 + 4096, n = 0;
    uint8_t *f = malloc(cap);
    *len = PS_CONFIG_BYTES + 8;
    for (uint32_t sh = 0; f && sh < cfg->shards; sh++) {
        if (!ps_elastic_saves(s, id, sh))
            continue; /* its owner saves it, not its backups */
        uint8_t *blob;
        size_t bl;
        if (ps_table_shard_export(t, sh, false, &blob, &bl) != 0) {
            free(f);
            return NULL;
        }
        while (*len + ENTRY_BYTES + bl > cap) {
            uint8_t *g = realloc(f, cap *= 2);
            if (!g)
                free(f);
            f = g;
            if (!f)
                break;
        }
        if (f) {
            edl_put32(f + *len, sh), edl_put32(f + *len + 4, 0), edl_put64(f + *len + 8, bl);
            memcpy(f + *len + ENTRY_BYTES, blob, bl);
            *len += ENTRY_BYTES + bl;
            n++;
        }
        free(blob);
    }
    if (f) {
        ps_config_encode(cfg, f);
        edl_put32(f + PS_CONFIG_BYTES, (uint32_t)n), edl_put32(f + PS_CONFIG_BYTES + 4, 0);
    }
    return f;
}

static void free_file(void *data, void *arg)
{
    (void)arg;
    free(data);
}

static int queue_save(edl_ps_server *s, edl_ckpt_pending *p)
{
    for (size_t i = 0; i < sizeof s->cp.saves / sizeof *s->cp.saves; i++)
        if (!s->cp.saves[i]) {
            s->cp.saves[i] = p;
            return 0;
        }
    edl_ckpt_save_free(p); /* it goes on; its outcome is only not logged */
    return 0;
}

int ps_serve_save(edl_ps_server *s, const ps_request *r, char *why, size_t whylen)
{
    if (!s->cp.on)
        return edl_errf(why, whylen, EDL_ECONFIG, "this server has no checkpoint storage "
                        "(EDL_CHECKPOINT_URI)");
    edl_ckpt_shard sh[EDL_PS_MAX_TABLES];
    char names[EDL_PS_MAX_TABLES][16];
    size_t n = 0;
    int rc = 0;
    ps_elastic_read_lock(s); /* one map for the whole snapshot */
    for (uint16_t id = 0; id < EDL_PS_MAX_TABLES && rc == 0; id++) {
        ps_table *t = atomic_load(&s->tables[id]);
        size_t len;
        uint8_t *f = t ? table_file(s, id, t, &len) : NULL;
        if (t && !f)
            rc = edl_errf(why, whylen, EDL_ENOMEM, "out of memory to snapshot table %u", id);
        if (!f)
            continue;
        snprintf(names[n], sizeof names[n], "table-%u", id);
        sh[n] = (edl_ckpt_shard){.name = names[n], .data = f, .len = len, .free_fn = free_file};
        n++;
    }
    ps_elastic_read_unlock(s);
    pthread_mutex_lock(&s->cp.mu);
    edl_ckpt_pending *p = NULL;
    if (rc == 0 && (rc = ckpt_for(s, (int)r->rank, (int)r->world, why, whylen)) == 0 &&
        (rc = edl_ckpt_save_async(s->cp.ck, (int64_t)r->step, (int64_t)r->gen, sh, n,
                                  "{\"ps\":true}", &p)) != 0)
        edl_errf(why, whylen, rc, "%s", edl_ckpt_errmsg(s->cp.ck));
    if (rc == 0)
        queue_save(s, p);
    pthread_mutex_unlock(&s->cp.mu);
    for (size_t i = 0; rc && i < n; i++) /* not handed over: ours to free */
        free((void *)sh[i].data);
    return rc;
}

void ps_ckpt_reap(edl_ps_server *s)
{
    pthread_mutex_lock(&s->cp.mu);
    for (size_t i = 0; i < sizeof s->cp.saves / sizeof *s->cp.saves; i++) {
        edl_ckpt_pending *p = s->cp.saves[i];
        if (!p || !edl_ckpt_save_done(p))
            continue;
        int rc = edl_ckpt_wait(p, 0);
        if (rc)
            EDL_WARN("ps", "a PS checkpoint upload failed: %s", edl_ckpt_save_errmsg(p));
        edl_ckpt_save_free(p);
        s->cp.saves[i] = NULL;
    }
    pthread_mutex_unlock(&s->cp.mu);
}

/* ---- restore ------------------------------------------------------------------------------- */

/* Import the entries of one table file that the due list wants. */
static void take_entries(edl_ps_server *s, ps_table *t, uint16_t id, const uint8_t *f,
                         size_t len, ps_due *due, size_t n)
{
    char why[256];
    edl_ps_table_config cfg;
    if (len < PS_CONFIG_BYTES + 8 || ps_config_parse(f, &cfg, why, sizeof why) != 0 ||
        !ps_config_equal(&cfg, ps_table_config(t))) {
        EDL_WARN("ps", "checkpoint file of table %u: not this table's (config differs)", id);
        return;
    }
    size_t at = PS_CONFIG_BYTES + 8;
    for (uint32_t k = 0, m = edl_get32(f + PS_CONFIG_BYTES); k < m; k++) {
        uint64_t bl = at + ENTRY_BYTES <= len ? edl_get64(f + at + 8) : UINT64_MAX;
        if (bl > len - at - ENTRY_BYTES || at + ENTRY_BYTES > len) {
            EDL_WARN("ps", "checkpoint file of table %u is truncated", id);
            return;
        }
        uint32_t sh = edl_get32(f + at);
        for (size_t i = 0; i < n; i++) {
            if (due[i].done || due[i].table != id || due[i].shard != sh)
                continue;
            int rc = ps_elastic_restore_shard(s, t, id, sh, f + at + ENTRY_BYTES, bl, why,
                                              sizeof why);
            if (rc == 0) {
                due[i].done = true;
                atomic_fetch_add(&s->shards_restored, 1);
            } else if (rc != EDL_ECONFLICT) {
                EDL_WARN("ps", "checkpoint shard %u of table %u: %s", sh, id, why);
            }
        }
        at += ENTRY_BYTES + bl;
    }
}

/* Whether a shard of table `table` (-1: of any table) is still due. */
static bool still_due(const ps_due *due, size_t n, int table)
{
    for (size_t i = 0; i < n; i++)
        if (!due[i].done && (table < 0 || due[i].table == table))
            return true;
    return false;
}

/* Take the due shards from checkpoint m: each table file this server wants is read once, its
 * digest checked as it arrives. Returns whether a wanted file was unreadable or corrupt (its
 * shards stay due, for an older checkpoint). */
static bool restore_from(edl_ps_server *s, const edl_ckpt_manifest *m, ps_due *due, size_t n)
{
    bool bad = false;
    for (size_t i = 0; i < m->n_shards; i++) {
        unsigned id;
        int used = 0;
        if (sscanf(m->shards[i].name, "table-%u%n", &id, &used) != 1 ||
            m->shards[i].name[used] || id >= EDL_PS_MAX_TABLES ||
            !still_due(due, n, (int)id))
            continue;
        ps_table *t = atomic_load(&s->tables[id]);
        void *f = NULL;
        size_t len;
        if (t && edl_ckpt_read_shard(s->cp.ck, m, i, &f, &len) == 0) {
            take_entries(s, t, (uint16_t)id, f, len, due, n);
        } else if (t) {
            EDL_WARN("ps", "reading %s of checkpoint %s: %s", m->shards[i].key, m->dir,
                     edl_ckpt_errmsg(s->cp.ck));
            bad = true;
        }
        free(f);
    }
    return bad;
}

/* The newest checkpoint, then (for the shards a corrupt or unreadable file held) each older one
 * the pointer keeps. A load checks only that the files are there at their sizes (the handle is
 * opened without verify_on_load): the one read of each wanted file checks its digest, and no
 * server reads the files of tables it does not restore. */
void ps_ckpt_restore(edl_ps_server *s, ps_due *due, size_t n, char *from,
                     size_t fromlen)
{
    char why[512];
    edl_ckpt_manifest *m = NULL;
    from[0] = '\0';
    if (!s->cp.on || n == 0)
        return;
    pthread_mutex_lock(&s->cp.mu);
    int rc = ckpt_for(s, s->cp.ck ? s->cp.rank : 0, s->cp.ck ? s->cp.world : 1, why, sizeof why);
    if (rc == 0 && (rc = edl_ckpt_load_latest(s->cp.ck, &m)) != 0 && rc != EDL_ENOTFOUND)
        EDL_WARN("ps", "no PS checkpoint to restore %zu shards from: %s", n,
                 edl_ckpt_errmsg(s->cp.ck));
    size_t used = 0;
    while (rc == 0) {
        bool bad = restore_from(s, m, due, n);
        if (used < fromlen)
            used += (size_t)snprintf(from + used, fromlen - used, "%sPS checkpoint %s (step %lld)",
                                     used ? ", then " : "", m->dir, (long long)m->step);
        if (!bad || !still_due(due, n, -1))
            break;
        int64_t step = m->step;
        edl_ckpt_manifest_free(m);
        m = NULL;
        if ((rc = edl_ckpt_load_older(s->cp.ck, step, &m)) == 0)
            EDL_WARN("ps", "the shards left of checkpoint step %lld come from step %lld",
                     (long long)step, (long long)m->step);
    }
    edl_ckpt_manifest_free(m);
    pthread_mutex_unlock(&s->cp.mu);
}
