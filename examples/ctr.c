/* ctr.c: click-through-rate training on the parameter server: logistic regression plus
 * embeddings over 13 dense and 26 sparse slots, on click data drawn from a planted model (so
 * the best AUC and logloss are known: the planted model's own, printed beside the learned).
 *
 *   ctr [--local] [--examples N] [--test N] [--epochs E] [--batch B] [--threads T] [--seed S]
 *       [--accessor plain|ctr] [--shrink-every N] [--replicas R] [--save-every N]
 *
 * Roles come from the environment, as Paddle's launchers (and edl's agent) set them
 * (edl_fleet, see ps.h): TRAINING_ROLE=PSERVER serves the tables; TRAINING_ROLE=TRAINER trains
 * its share of the examples (example i goes to worker i mod PADDLE_TRAINERS_NUM) in
 * EDL_PS_MODE (sync, async, half_async, geo), and worker 0 evaluates the servers' model on the
 * test set once every worker is done. --local trains the same model in this one process, with
 * no servers: the reference for the accuracy and for the examples per second.
 *
 * The model: logit = bias + w . x + sum over slots of lr[key] + v . mean over slots of
 * emb[key]; tables 0 (lr, sparse, 1 float), 1 (emb, sparse, 8 floats), 2 (dense: w, bias, v),
 * Adagrad on the servers (GEO: the trainers' local SGD on the sparse tables); table 3 counts
 * the job's batches trained, so that workers the agent restarts for a later generation (a
 * worker joined, left or failed) resume where the job got to instead of starting over.
 * --accessor ctr (or EDL_PS_ACCESSOR=ctr): as Paddle's CTR models do, lr and emb are one row
 * of table 1 with the CTR accessor (dim 9: embed_w is lr, embedx is emb, zeros until the key's
 * show/click score reaches the threshold); each push carries show 1 and click y per key, and
 * worker 0 shrinks the table every N steps (--shrink-every, default 100). sync, async and
 * half_async; --local always trains the plain model. --save-every N: worker 0 saves a PS
 * checkpoint every N steps (the servers keep them where EDL_CHECKPOINT_URI says), so that a
 * server that dies without replicas comes back as of the last one. */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edl/agent_link.h"
#include "edl/ps.h"

#define NDENSE 13
#define NSLOT 26
#define EMB 8
#define VOCAB 5000
#define NPARAM (NDENSE + 1 + EMB) /* the dense table: w, bias, v */
#define T_LR 0
#define T_EMB 1
#define T_DENSE 2
#define T_PROGRESS 3 /* dense, 1 float: the job's batches trained (SGD, lr 1: -1 adds 1) */
#define NTABLE 4

typedef struct opts {
    bool local, ctr; /* ctr: the CTR accessor on table 1 */
    long replicas;   /* of every table on the servers */
    long examples, test, epochs, batch, threads, shrink_every, save_every;
    uint64_t seed;
} opts;

typedef struct example {
    float x[NDENSE], y, planted; /* planted: the true model's logit */
    uint64_t key[NSLOT];
} example;

/* ---- the data ------------------------------------------------------------------------------ */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float unit(uint64_t h) /* [0, 1) */
{
    return (float)(h >> 40) / 16777216.0f;
}

static float sigmoid(float z)
{
    return 1 / (1 + expf(-z));
}

/* Example i of the stream drawn with seed (tests draw from another part of the stream). */
static void make_example(uint64_t seed, uint64_t i, example *e)
{
    uint64_t h = mix(seed * 0x9e3779b97f4a7c15ull + i);
    float logit = -1.0f;
    for (int d = 0; d < NDENSE; d++) {
        e->x[d] = 2 * unit(h = mix(h + 1)) - 1;
        logit += (2 * unit(mix(seed ^ (0x1000u + (unsigned)d))) - 1) * e->x[d];
    }
    for (int s = 0; s < NSLOT; s++) {
        float u = unit(h = mix(h + 1));
        uint64_t id = (uint64_t)(VOCAB * u * u); /* skewed: a few ids are common */
        e->key[s] = (uint64_t)(s + 1) << 32 | id;
        if (s % 2 == 0) /* half of the slots carry signal */
            logit += 0.6f * (2 * unit(mix(seed ^ e->key[s])) - 1);
    }
    e->planted = logit;
    e->y = unit(mix(h + 7)) < sigmoid(logit) ? 1.0f : 0.0f;
}

/* ---- the model, on pulled rows ------------------------------------------------------------ */

/* Forward and backward for one example: rows lr[NSLOT], emb[NSLOT][EMB], dense[NPARAM]; adds
 * the gradients (scaled by `scale`) into glr, gemb, gdense. Returns the predicted probability. */
static float example_grad(const example *e, const float *lr, const float *emb,
                          const float *dense, float scale, float *glr, float *gemb,
                          float *gdense)
{
    float pooled[EMB] = {0}, z = dense[NDENSE];
    for (int d = 0; d < NDENSE; d++)
        z += dense[d] * e->x[d];
    for (int s = 0; s < NSLOT; s++) {
        z += lr[s];
        for (int k = 0; k < EMB; k++)
            pooled[k] += emb[s * EMB + k] / NSLOT;
    }
    for (int k = 0; k < EMB; k++)
        z += dense[NDENSE + 1 + k] * pooled[k];
    float p = sigmoid(z), g = (p - e->y) * scale;
    if (!glr)
        return p;
    for (int d = 0; d < NDENSE; d++)
        gdense[d] += g * e->x[d];
    gdense[NDENSE] += g;
    for (int k = 0; k < EMB; k++)
        gdense[NDENSE + 1 + k] += g * pooled[k];
    for (int s = 0; s < NSLOT; s++) {
        glr[s] = g;
        for (int k = 0; k < EMB; k++)
            gemb[s * EMB + k] = g * dense[NDENSE + 1 + k] / NSLOT;
    }
    return p;
}

/* ---- evaluation ----------------------------------------------------------------------------- */

typedef struct scored {
    float p;
    float y;
} scored;

static int by_score(const void *a, const void *b)
{
    float x = ((const scored *)a)->p, y = ((const scored *)b)->p;
    return (x > y) - (x < y);
}

/* AUC (ties share their ranks' mean) and mean logloss. */
static void auc_logloss(scored *s, long n, double *auc, double *logloss)
{
    qsort(s, (size_t)n, sizeof *s, by_score);
    double pos = 0, rank_sum = 0, ll = 0;
    for (long i = 0, j; i < n; i = j) {
        for (j = i; j < n && s[j].p == s[i].p; j++)
            ;
        double mean_rank = (double)(i + j + 1) / 2; /* ranks are 1-based */
        for (long k = i; k < j; k++) {
            double p = fmin(fmax(s[k].p, 1e-7), 1 - 1e-7);
            ll -= s[k].y ? log(p) : log(1 - p);
            if (s[k].y) {
                pos++;
                rank_sum += mean_rank;
            }
        }
    }
    *auc = (rank_sum - pos * (pos + 1) / 2) / (pos * ((double)n - pos));
    *logloss = ll / (double)n;
}

/* Probabilities of n examples under a model. */
typedef int (*predict_fn)(void *model, const example *e, long n, float *p);

static int evaluate(const opts *o, predict_fn predict, void *model, const char *who,
                    double seconds, long trained, long threads, double bytes_per_example)
{
    enum { CHUNK = 1000 };
    scored *learned = malloc((size_t)o->test * sizeof *learned);
    scored *planted = malloc((size_t)o->test * sizeof *planted);
    example *e = malloc(CHUNK * sizeof *e);
    float p[CHUNK];
    int rc = 0;
    for (long i = 0; i < o->test && rc == 0; i += CHUNK) {
        long n = o->test - i < CHUNK ? o->test - i : CHUNK;
        for (long k = 0; k < n; k++)
            make_example(o->seed, (uint64_t)(o->examples + i + k), &e[k]);
        rc = predict(model, e, n, p);
        for (long k = 0; k < n; k++) {
            learned[i + k] = (scored){p[k], e[k].y};
            planted[i + k] = (scored){sigmoid(e[k].planted), e[k].y};
        }
    }
    double auc, ll, pauc, pll;
    auc_logloss(learned, o->test, &auc, &ll);
    auc_logloss(planted, o->test, &pauc, &pll);
    if (rc == 0)
        printf("ctr: %s: test AUC %.4f logloss %.4f (the planted model: AUC %.4f logloss "
               "%.4f); %.0f examples/s per trainer thread; %.0f bytes sent per example\n", who,
               auc, ll, pauc, pll, (double)trained / seconds / (double)threads,
               bytes_per_example);
    fflush(stdout);
    free(learned);
    free(planted);
    free(e);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- local: the same model in this process --------------------------------------------------- */

typedef struct local_model {
    float *lr, *emb, dense[NPARAM]; /* indexed by slot * VOCAB + id */
    float *alr, *aemb, adense[NPARAM]; /* Adagrad's sums of squares */
    float *glr, *gemb;              /* a batch's gradients, summed per key */
    uint8_t *in_batch;              /* per key: in touched */
    size_t *touched, ntouched;
} local_model;

static size_t key_index(uint64_t key)
{
    return (size_t)((key >> 32) - 1) * VOCAB + (size_t)(key & 0xffffffffu);
}

static void adagrad(float *w, float *acc, const float *g, int n)
{
    for (int i = 0; i < n; i++) {
        acc[i] += g[i] * g[i];
        w[i] -= 0.05f * g[i] / (sqrtf(acc[i]) + 1e-8f);
    }
}

static void local_rows(const local_model *m, const example *e, float *lr, float *emb)
{
    for (int s = 0; s < NSLOT; s++) {
        size_t k = key_index(e->key[s]);
        lr[s] = m->lr[k];
        memcpy(emb + s * EMB, m->emb + k * EMB, sizeof(float) * EMB);
    }
}

static int local_predict(void *arg, const example *e, long n, float *p)
{
    local_model *m = arg;
    for (long i = 0; i < n; i++) {
        float lr[NSLOT], emb[NSLOT * EMB];
        local_rows(m, &e[i], lr, emb);
        p[i] = example_grad(&e[i], lr, emb, m->dense, 0, NULL, NULL, NULL);
    }
    return 0;
}

/* One batch, as the servers see it: each key's gradients summed over the batch, then one
 * Adagrad update per key and one for the dense part. */
static void local_batch(local_model *m, const opts *o, long first)
{
    float gdense[NPARAM] = {0};
    for (long i = first; i < first + o->batch; i++) {
        example e;
        float lr[NSLOT], emb[NSLOT * EMB], glr[NSLOT], gemb[NSLOT * EMB];
        make_example(o->seed, (uint64_t)i, &e);
        local_rows(m, &e, lr, emb);
        example_grad(&e, lr, emb, m->dense, 1.0f / (float)o->batch, glr, gemb, gdense);
        for (int s = 0; s < NSLOT; s++) {
            size_t k = key_index(e.key[s]);
            if (!m->in_batch[k]) {
                m->in_batch[k] = 1;
                m->touched[m->ntouched++] = k;
            }
            m->glr[k] += glr[s];
            for (int j = 0; j < EMB; j++)
                m->gemb[k * EMB + j] += gemb[s * EMB + j];
        }
    }
    for (size_t t = 0; t < m->ntouched; t++) {
        size_t k = m->touched[t];
        adagrad(&m->lr[k], &m->alr[k], &m->glr[k], 1);
        adagrad(m->emb + k * EMB, m->aemb + k * EMB, m->gemb + k * EMB, EMB);
        m->glr[k] = 0;
        m->in_batch[k] = 0;
        memset(m->gemb + k * EMB, 0, sizeof(float) * EMB);
    }
    m->ntouched = 0;
    adagrad(m->dense, m->adense, gdense, NPARAM);
}

static int run_local(const opts *o)
{
    size_t rows = (size_t)NSLOT * VOCAB;
    local_model m = {.lr = calloc(rows, 4), .emb = calloc(rows * EMB, 4),
                     .alr = calloc(rows, 4), .aemb = calloc(rows * EMB, 4),
                     .glr = calloc(rows, 4), .gemb = calloc(rows * EMB, 4),
                     .in_batch = calloc(rows, 1),
                     .touched = calloc((size_t)o->batch * NSLOT, sizeof(size_t))};
    for (size_t i = 0; i < rows * EMB; i++) /* as the servers' uniform init: +-0.01 */
        m.emb[i] = 0.01f * (2 * unit(mix(o->seed ^ i)) - 1);
    double t0 = now_s();
    long trained = 0;
    for (long ep = 0; ep < o->epochs; ep++)
        for (long b = 0; b + o->batch <= o->examples; b += o->batch, trained += o->batch)
            local_batch(&m, o, b);
    int rc = evaluate(o, local_predict, &m, "local, one process", now_s() - t0, trained, 1, 0);
    free(m.lr), free(m.emb), free(m.alr), free(m.aemb), free(m.glr), free(m.gemb);
    free(m.touched), free(m.in_batch);
    return rc;
}

/* ---- on the parameter server ---------------------------------------------------------------- */

typedef struct ps_worker {
    edl_fleet *f;
    edl_agent_link *link; /* under the agent, thread 0 reports its steps (progress) */
    const opts *o;
    long thread, trained;
    long first, steps;         /* the job's batch where this process began; steps to train */
    uint64_t shrinks, evicted; /* ctr: worker 0's first thread shrinks */
    uint64_t saves;            /* PS checkpoints it asked for (--save-every) */
    example *e, *next;         /* this step's batch; the next one's (async: made early) */
    uint64_t *keys, *next_keys; /* their keys */
    bool have_next;            /* next holds the next step's batch, its rows pulled ahead */
    int rc;
} ps_worker;

static void tables(edl_ps_table_config cfg[NTABLE], edl_ps_mode mode, int workers, bool ctr)
{
    for (int t = 0; t < NTABLE; t++) {
        edl_ps_table_config_init(&cfg[t]);
        cfg[t].optimizer = EDL_PS_ADAGRAD;
        cfg[t].lr = 0.05f;
        cfg[t].seed = 11;
    }
    cfg[T_LR].dim = 1;
    cfg[T_LR].init = EDL_PS_INIT_ZERO;
    cfg[T_EMB].dim = EMB;
    cfg[T_DENSE].kind = EDL_PS_DENSE;
    cfg[T_DENSE].dim = 1;
    cfg[T_DENSE].size = NPARAM;
    cfg[T_DENSE].init = EDL_PS_INIT_ZERO;
    cfg[T_PROGRESS].kind = EDL_PS_DENSE;
    cfg[T_PROGRESS].dim = 1;
    cfg[T_PROGRESS].size = 1;
    cfg[T_PROGRESS].init = EDL_PS_INIT_ZERO;
    cfg[T_PROGRESS].optimizer = EDL_PS_SGD;
    cfg[T_PROGRESS].lr = 1;
    if (mode == EDL_PS_MODE_GEO) /* the trainers train local copies with SGD */
        for (int t = T_LR; t <= T_EMB; t++) {
            cfg[t].geo_trainers = (uint32_t)workers;
            cfg[t].optimizer = EDL_PS_SGD;
            cfg[t].lr = 10.0f;
        }
    if (ctr) { /* table 1 holds lr (embed_w) and emb (embedx); Paddle's CTR defaults */
        cfg[T_EMB].dim = 1 + EMB;
        cfg[T_EMB].accessor = EDL_PS_ACCESSOR_CTR;
    }
}

/* A sparse table's rows of keys, through the trainer when there is one. */
static int pull(edl_ps_trainer *t, edl_ps_client *c, uint32_t table, const uint64_t *keys,
                size_t n, float *out)
{
    return t ? edl_ps_trainer_pull_sparse(t, table, keys, n, out)
             : edl_ps_pull_sparse(c, table, keys, n, out);
}

/* Pull the rows of n examples' keys: lr[n * NSLOT], emb[n * NSLOT * EMB], dense. wide: room
 * for the CTR table's rows (n * NSLOT * (1 + EMB) floats), split into lr and emb; NULL: the
 * plain tables. */
static void example_keys(const example *e, long n, uint64_t *keys)
{
    for (long i = 0; i < n; i++)
        memcpy(keys + i * NSLOT, e[i].key, sizeof e[i].key);
}

static int pull_rows(edl_ps_trainer *t, edl_ps_client *c, const example *e, long n,
                     uint64_t *keys, float *lr, float *emb, float *dense, float *wide)
{
    example_keys(e, n, keys);
    size_t nk = (size_t)n * NSLOT;
    int rc = pull(t, c, wide ? T_EMB : T_LR, keys, nk, wide ? wide : lr);
    for (size_t i = 0; rc == 0 && wide && i < nk; i++) {
        lr[i] = wide[i * (1 + EMB)];
        memcpy(emb + i * EMB, wide + i * (1 + EMB) + 1, sizeof(float) * EMB);
    }
    if (rc == 0 && !wide)
        rc = pull(t, c, T_EMB, keys, nk, emb);
    if (rc == 0)
        rc = t ? edl_ps_trainer_pull_dense(t, T_DENSE, 0, NPARAM, dense)
               : edl_ps_pull_dense(c, T_DENSE, 0, NPARAM, dense);
    return rc;
}

/* The CTR table's push: per key show 1, click y, then its gradients (lr's, then emb's). */
static int push_ctr(edl_ps_trainer *t, const example *e, long n, const uint64_t *keys,
                    const float *glr, const float *gemb, float *wide)
{
    for (long i = 0; i < n * NSLOT; i++) {
        float *v = wide + i * (3 + EMB);
        v[0] = 1, v[1] = e[i / NSLOT].y, v[2] = glr[i];
        memcpy(v + 3, gemb + i * EMB, sizeof(float) * EMB);
    }
    return edl_ps_trainer_push_sparse(t, T_EMB, keys, (size_t)n * NSLOT, wide);
}

/* Worker 0's first thread shrinks the CTR table every shrink_every steps. */
static int maybe_shrink(ps_worker *w, long step)
{
    uint64_t evicted;
    if (!w->o->ctr || !w->o->shrink_every || w->thread || edl_fleet_worker_index(w->f) ||
        (step + 1) % w->o->shrink_every)
        return 0;
    int rc = edl_ps_trainer_shrink(edl_fleet_trainer(w->f), T_EMB, &evicted);
    w->shrinks++;
    w->evicted += rc ? 0 : evicted;
    return rc;
}

/* Worker 0's first thread saves a PS checkpoint every save_every steps. */
static int maybe_save(ps_worker *w, long step)
{
    if (!w->o->save_every || w->thread || edl_fleet_worker_index(w->f) ||
        (step + 1) % w->o->save_every)
        return 0;
    w->saves++;
    return edl_ps_trainer_save(edl_fleet_trainer(w->f), step + 1);
}

/* The batch of `step` into e: the job's batches from w->first on are dealt round robin to
 * the workers' threads. */
static void make_batch(const ps_worker *w, long step, example *e)
{
    const opts *o = w->o;
    long b = o->batch, nw = edl_fleet_worker_num(w->f), wi = edl_fleet_worker_index(w->f);
    long first = (w->first + (step * nw + wi) * o->threads + w->thread) * b;
    for (long i = 0; i < b; i++)
        make_example(o->seed, (uint64_t)((first + i) % o->examples), &e[i]);
}

/* async: make the batch of `step` now and have its rows pulled while this step computes. */
static int pull_ahead(ps_worker *w, long step, long last)
{
    edl_ps_trainer *t = edl_fleet_trainer(w->f);
    size_t nk = (size_t)w->o->batch * NSLOT;
    if (edl_fleet_mode(w->f) != EDL_PS_MODE_ASYNC || step > last)
        return 0;
    make_batch(w, step, w->next);
    example_keys(w->next, w->o->batch, w->next_keys);
    w->have_next = true;
    int rc = edl_ps_trainer_prefetch_sparse(t, w->o->ctr ? T_EMB : T_LR, w->next_keys, nk);
    return rc || w->o->ctr ? rc : edl_ps_trainer_prefetch_sparse(t, T_EMB, w->next_keys, nk);
}

static int ps_step(ps_worker *w, long step, long last, float *rows, float *wide)
{
    const opts *o = w->o;
    edl_ps_trainer *t = edl_fleet_trainer(w->f);
    long b = o->batch;
    float *lr = rows, *emb = lr + b * NSLOT, *glr = emb + b * NSLOT * EMB;
    float *gemb = glr + b * NSLOT, dense[NPARAM], gdense[NPARAM] = {0};
    if (w->have_next) { /* made by the step before */
        example *e = w->e;
        w->e = w->next, w->next = e;
        w->have_next = false;
    } else {
        make_batch(w, step, w->e);
    }
    example *e = w->e;
    uint64_t *keys = w->keys;
    int rc = pull_rows(t, NULL, e, b, keys, lr, emb, dense, o->ctr ? wide : NULL);
    if (rc == 0)
        rc = pull_ahead(w, step + 1, last);
    for (long i = 0; rc == 0 && i < b; i++)
        example_grad(&e[i], lr + i * NSLOT, emb + i * NSLOT * EMB, dense, 1.0f / (float)b,
                     glr + i * NSLOT, gemb + i * NSLOT * EMB, gdense);
    if (rc == 0 && o->ctr) /* repeated keys: the client sums their shows and gradients */
        rc = push_ctr(t, e, b, keys, glr, gemb, wide);
    if (rc == 0 && !o->ctr)
        rc = edl_ps_trainer_push_sparse(t, T_LR, keys, (size_t)b * NSLOT, glr);
    if (rc == 0 && !o->ctr)
        rc = edl_ps_trainer_push_sparse(t, T_EMB, keys, (size_t)b * NSLOT, gemb);
    if (rc == 0)
        rc = edl_ps_trainer_push_dense(t, T_DENSE, 0, NPARAM, gdense);
    if (rc == 0) /* one more batch trained, applied with its gradients */
        rc = edl_ps_trainer_push_dense(t, T_PROGRESS, 0, 1, &(float){-1});
    if (rc == 0)
        rc = edl_ps_trainer_step(t);
    if (rc == 0)
        rc = maybe_shrink(w, step);
    return rc ? rc : maybe_save(w, step);
}

static void *ps_thread(void *arg)
{
    ps_worker *w = arg;
    long b = w->o->batch, last = w->steps - 1;
    long base = w->first / (edl_fleet_worker_num(w->f) * w->o->threads); /* reported steps */
    w->e = malloc((size_t)b * sizeof *w->e);
    w->next = malloc((size_t)b * sizeof *w->next);
    w->keys = malloc((size_t)b * NSLOT * sizeof *w->keys);
    w->next_keys = malloc((size_t)b * NSLOT * sizeof *w->next_keys);
    float *rows = malloc((size_t)b * NSLOT * (1 + EMB) * 2 * sizeof *rows);
    float *wide = malloc((size_t)b * NSLOT * (3 + EMB) * sizeof *wide);
    for (long s = 0; s < w->steps && w->rc == 0; s++, w->trained += b) {
        w->rc = ps_step(w, s, last, rows, wide);
        if (w->link)
            edl_agent_link_report_step(w->link, base + s + 1);
    }
    if (w->rc)
        fprintf(stderr, "ctr: worker %d thread %ld: %s\n", edl_fleet_worker_index(w->f),
                w->thread, edl_ps_trainer_errmsg(edl_fleet_trainer(w->f)));
    free(w->e);
    free(w->next);
    free(w->keys);
    free(w->next_keys);
    free(rows);
    free(wide);
    return NULL;
}

typedef struct predictor {
    edl_ps_client *c;
    bool ctr;
} predictor;

static int ps_predict(void *arg, const example *e, long n, float *p)
{
    const predictor *pr = arg;
    edl_ps_client *c = pr->c;
    uint64_t *keys = malloc((size_t)n * NSLOT * sizeof *keys);
    float *lr = malloc((size_t)n * NSLOT * (1 + EMB) * 2 * sizeof *lr), *emb = lr + n * NSLOT;
    float dense[NPARAM];
    int rc = pull_rows(NULL, c, e, n, keys, lr, emb, dense,
                       pr->ctr ? emb + n * NSLOT * EMB : NULL);
    for (long i = 0; rc == 0 && i < n; i++)
        p[i] = example_grad(&e[i], lr + i * NSLOT, emb + i * NSLOT * EMB, dense, 0, NULL, NULL,
                            NULL);
    if (rc)
        fprintf(stderr, "ctr: evaluating: %s\n", edl_ps_client_errmsg(c));
    free(keys);
    free(lr);
    return rc;
}

/* What the shrinks did, and the CTR table's rows and memory on the servers now. */
static int report_ctr(edl_ps_client *c, uint64_t shrinks, uint64_t evicted)
{
    edl_ps_server_stats st;
    int rc = edl_ps_stats(c, &st);
    if (rc == 0)
        printf("ctr: CTR table: %llu shrinks evicted %llu rows; %llu rows on the servers in "
               "%.1f MiB (with the dense table)\n", (unsigned long long)shrinks,
               (unsigned long long)evicted, (unsigned long long)st.rows,
               (double)st.bytes / (1 << 20));
    else
        fprintf(stderr, "ctr: stats: %s\n", edl_ps_client_errmsg(c));
    return rc;
}

/* The job's batches trained so far, as the servers count them (the progress table). */
static int job_progress(edl_fleet *f, long *batches)
{
    float v = 0;
    int rc = edl_ps_pull_dense(edl_fleet_client(f), T_PROGRESS, 0, 1, &v);
    *batches = lroundf(v);
    if (rc)
        fprintf(stderr, "ctr: reading the job's progress: %s\n",
                edl_ps_client_errmsg(edl_fleet_client(f)));
    return rc;
}

/* Where this worker's share begins: at the job's first batch, or, when the agent restarted
 * the workers for a later generation (a worker joined, left or failed), where the job got to:
 * they deal the batches not yet trained among themselves instead of starting over. */
static int first_batch(edl_fleet *f, long total, long *first)
{
    uint32_t gen = edl_fleet_generation(f);
    *first = 0;
    if (gen <= 1)
        return 0;
    int rc = job_progress(f, first);
    if (rc == 0 && *first > total)
        *first = total;
    if (rc == 0 && *first > 0)
        printf("ctr: worker %d of %d resumes at batch %ld of the job's %ld (generation %u)\n",
               edl_fleet_worker_index(f), edl_fleet_worker_num(f), *first, total, gen);
    fflush(stdout);
    return rc;
}

static int train_on_servers(edl_fleet *f, const opts *o)
{
    long nw = edl_fleet_worker_num(f), total = o->epochs * (o->examples / o->batch), first;
    if (first_batch(f, total, &first) != 0)
        return 1;
    long steps = (total - first) / (nw * o->threads);
    ps_worker w[64];
    pthread_t th[64];
    edl_agent_link *link = NULL;
    if (edl_agent_link_open(&link) != 0)
        link = NULL;
    double t0 = now_s();
    for (long i = 0; i < o->threads; i++) {
        w[i] = (ps_worker){.f = f, .link = i ? NULL : link, .o = o, .thread = i,
                           .first = first, .steps = steps};
        pthread_create(&th[i], NULL, ps_thread, &w[i]);
    }
    long trained = 0;
    uint64_t shrinks = 0, evicted = 0, saves = 0;
    int rc = 0;
    for (long i = 0; i < o->threads; i++) {
        pthread_join(th[i], NULL);
        trained += w[i].trained;
        shrinks += w[i].shrinks, evicted += w[i].evicted, saves += w[i].saves;
        rc = rc ? rc : w[i].rc;
    }
    edl_agent_link_close(link);
    if (saves)
        printf("ctr: worker 0 saved %llu PS checkpoints\n", (unsigned long long)saves);
    if (rc == 0)
        rc = edl_ps_trainer_flush(edl_fleet_trainer(f));
    double seconds = now_s() - t0;
    uint64_t sent, received;
    edl_ps_trainer_traffic(edl_fleet_trainer(f), &sent, &received);
    if (rc == 0)
        rc = edl_fleet_barrier_worker(f); /* every worker's updates are in */
    if (rc == 0 && edl_fleet_worker_index(f) == 0 && o->ctr)
        rc = report_ctr(edl_fleet_client(f), shrinks, evicted);
    long done;
    if (rc == 0 && edl_fleet_worker_index(f) == 0 && (rc = job_progress(f, &done)) == 0)
        printf("ctr: the job trained %ld batches of its %ld\n", done, total);
    if (rc == 0 && edl_fleet_worker_index(f) == 0) {
        char who[128];
        predictor pr = {.c = edl_fleet_client(f), .ctr = o->ctr};
        snprintf(who, sizeof who, "%s%s, %ld workers x %ld threads, %d servers",
                 edl_ps_mode_name(edl_fleet_mode(f)), o->ctr ? " (CTR accessor)" : "", nw,
                 o->threads, edl_fleet_server_num(f));
        rc = evaluate(o, ps_predict, &pr, who, seconds, trained, o->threads,
                      (double)sent / (double)trained);
    }
    return rc;
}

static int run_fleet(const opts *o)
{
    edl_fleet *f;
    char why[512];
    int rc = edl_fleet_init(&f, why, sizeof why);
    if (rc == 0 && edl_fleet_is_server(f))
        rc = edl_fleet_run_server(f, why, sizeof why);
    else if (rc == 0 && o->ctr && edl_fleet_mode(f) == EDL_PS_MODE_GEO)
        rc = 2, snprintf(why, sizeof why, "the CTR accessor trains in sync, async and "
                         "half_async; geo mode keeps no show/click statistics");
    else if (rc == 0 && (rc = edl_fleet_init_worker(f, why, sizeof why)) == 0) {
        edl_ps_table_config cfg[NTABLE];
        tables(cfg, edl_fleet_mode(f), edl_fleet_worker_num(f), o->ctr);
        for (int t = 0; t < NTABLE; t++)
            cfg[t].replicas = (uint32_t)o->replicas;
        for (int t = o->ctr ? T_EMB : T_LR; t < NTABLE && rc == 0; t++) /* ctr: no table 0 */
            rc = edl_ps_create_table(edl_fleet_client(f), (uint32_t)t, &cfg[t]);
        if (rc)
            snprintf(why, sizeof why, "%s", edl_ps_client_errmsg(edl_fleet_client(f)));
        if (rc == 0 && (rc = train_on_servers(f, o)) != 0)
            snprintf(why, sizeof why, "training failed (above)");
        int stop = edl_fleet_stop_worker(f);
        rc = rc ? rc : stop;
    }
    if (rc)
        fprintf(stderr, "ctr: %s\n", why);
    edl_fleet_free(f);
    return rc ? 1 : 0;
}

/* ---- options -------------------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out, "Usage: ctr [--local] [--examples N] [--test N] [--epochs E] [--batch B]\n"
                 "           [--threads T] [--seed S] [--accessor plain|ctr] [--shrink-every N]\n"
                 "           [--replicas R] [--save-every N]\n"
                 "CTR training (logistic regression plus embeddings, 13 dense and 26 sparse\n"
                 "slots) on click data from a planted model. The role comes from TRAINING_ROLE\n"
                 "(TRAINER or PSERVER) and the rest of Paddle's environment (see the file's\n"
                 "header); --local trains the same model in this process, with no servers.\n"
                 "Defaults: 200000 examples, 50000 test, 1 epoch, batches of 256, 1 thread\n"
                 "(half_async and async: more share the trainer), seed 1.\n"
                 "--accessor ctr (or EDL_PS_ACCESSOR=ctr): lr and emb are one row of a table\n"
                 "with the CTR accessor (show and click pushed; embedx past the score\n"
                 "threshold), shrunk by worker 0 every N steps (default 100; 0: never).\n"
                 "--local always trains the plain model. --replicas R (or EDL_PS_REPLICAS):\n"
                 "each update applied on R servers (1..3, default 1), so that a server that\n"
                 "dies loses none. --save-every N: worker 0 saves a PS checkpoint every N\n"
                 "steps (default 0: never; the servers need EDL_CHECKPOINT_URI).\n"
                 "Under the agent, workers it restarts for a later generation resume at the\n"
                 "job's progress (batches trained, counted on the servers) and share the rest.\n");
}

static int parse(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"local", 0, 0, 'l'}, {"examples", 1, 0, 'n'}, {"test", 1, 0, 't'},
        {"epochs", 1, 0, 'e'}, {"batch", 1, 0, 'b'}, {"threads", 1, 0, 'T'},
        {"seed", 1, 0, 's'}, {"accessor", 1, 0, 'a'}, {"shrink-every", 1, 0, 'S'},
        {"replicas", 1, 0, 'r'}, {"save-every", 1, 0, 'v'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    const char *acc = getenv("EDL_PS_ACCESSOR"), *reps = getenv("EDL_PS_REPLICAS");
    *o = (opts){.examples = 200000, .test = 50000, .epochs = 1, .batch = 256, .threads = 1,
                .seed = 1, .shrink_every = 100, .replicas = reps && *reps ? atol(reps) : 1};
    for (int c; (c = getopt_long(argc, argv, "h", lo, NULL)) != -1;) {
        long v = optarg ? atol(optarg) : 0;
        switch (c) {
        case 'l': o->local = true; break;
        case 'n': o->examples = v; break;
        case 't': o->test = v; break;
        case 'e': o->epochs = v; break;
        case 'b': o->batch = v; break;
        case 'T': o->threads = v; break;
        case 's': o->seed = (uint64_t)v; break;
        case 'a': acc = optarg; break;
        case 'S': o->shrink_every = v; break;
        case 'r': o->replicas = v; break;
        case 'v': o->save_every = v; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
    if (o->examples < 1 || o->test < 2 || o->epochs < 1 || o->batch < 1 || o->batch > 4096 ||
        o->threads < 1 || o->threads > 64 || o->replicas < 1 ||
        o->replicas > EDL_PS_MAX_REPLICAS) {
        fprintf(stderr, "ctr: want examples >= 1, test >= 2, epochs >= 1, batch 1..4096, "
                        "threads 1..64, replicas 1..%d (try --help)\n", EDL_PS_MAX_REPLICAS);
        return 2;
    }
    if ((acc && strcmp(acc, "plain") && strcmp(acc, "ctr")) || o->shrink_every < 0 ||
        o->save_every < 0) {
        fprintf(stderr, "ctr: the accessor is plain or ctr (--accessor, EDL_PS_ACCESSOR: "
                        "'%s'), shrink-every and save-every >= 0\n", acc ? acc : "");
        return 2;
    }
    o->ctr = acc && !strcmp(acc, "ctr");
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;
    return o.local ? run_local(&o) : run_fleet(&o);
}
