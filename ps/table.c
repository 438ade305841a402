/* table.c: a server's tables. Each of a table's virtual shards has its own lock and storage:
 *   sparse: an open-addressing hash of keys to rows in one growing array; a row is its dim
 *           weights followed by its optimizer state, created on first touch (CTR tables: the
 *           row of the CTR accessor below, and a pool of embedx parts beside the rows);
 *   dense:  the shard's range of the array, with the optimizer's state beside it in arrays of
 *           its own, allocated on the first touch of the shard.
 * Optimizers (applied here, on the server, one update per pushed gradient):
 *   SGD      w -= lr g
 *   Adagrad  s += g^2; w -= lr g / (sqrt(s) + eps)
 *   Adam     m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; per row (per element in dense
 *            tables) p1 *= b1, p2 *= b2; w -= lr sqrt(1-p2) / (1-p1) m / (sqrt(v) + eps)
 * Initial values are a function of (seed, key, column), so a row is born the same on any
 * server: a reference computed in one process agrees with the servers bit for bit. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "edl/wire.h"
#include "internal.h"

/* GEO: which rows changed since each trainer's last GEO pull: a bit per trainer per row, and
 * per trainer the list of those rows (a row is listed once however often it changes). */
typedef struct geo_shard {
    uint64_t *mask;                          /* per row */
    uint32_t *list[EDL_PS_MAX_GEO_TRAINERS]; /* row indexes */
    size_t n[EDL_PS_MAX_GEO_TRAINERS], cap[EDL_PS_MAX_GEO_TRAINERS];
} geo_shard;

/* A slot of a shard's hash: a key and its row's index, four to a cache line (the hash is on
 * lines). A probe from a key's home slot mostly ends within its line or the next. */
typedef struct slot {
    uint64_t key;
    uint32_t row1;    /* row index + 1; 0: empty */
} slot;

#define SLOTS_A_LINE (64 / sizeof(slot))

typedef struct sparse_shard {
    pthread_mutex_t mu;
    slot *slots;
    size_t cap;       /* slots, a power of two */
    float *rows;
    uint64_t *rowkey; /* per row: its key (iteration: sync apply, GEO pulls) */
    size_t nrows, rows_cap;
    geo_shard *geo;   /* GEO tables only */
    ps_dedup dd;
    float *x;         /* CTR tables: the pool of embedx parts (xstride floats each) */
    size_t nx, x_cap;
} sparse_shard;

typedef struct dense_shard {
    pthread_mutex_t mu;
    float *w, *s1, *s2, *p1, *p2; /* weights; Adagrad s1; Adam m = s1, v = s2, powers */
    ps_dedup dd;
} dense_shard;

struct ps_table {
    edl_ps_table_config cfg;
    size_t stride;  /* floats per sparse row */
    size_t width;   /* floats a key in a push (ps_push_width) */
    size_t xstride; /* CTR: floats of an embedx part (its weights and state); 0: plain */
    sparse_shard *sp;
    dense_shard *dn;
    pthread_mutex_t shrink_mu; /* the last shrink: its token and counts */
    bool shrunk;
    uint64_t shrink_token, shrink_evicted, shrink_left;
};

static atomic_uint_fast64_t next_req = 1;

/* ---- the CTR accessor's rows -----------------------------------------------------------------
 * A CTR row: show, click, unseen (uint32: shrinks since the last push), x (uint32: its embedx
 * part's index in the shard's pool + 1; 0: none yet), embed_w and embed_w's optimizer state.
 * An embedx part: dim - 1 weights and their optimizer state (Adam: its own powers). */
enum { CTR_SHOW = 0, CTR_CLICK = 1, CTR_UNSEEN = 2, CTR_X = 3, CTR_W = 4 };

static uint32_t row_u32(const float *row, int i)
{
    uint32_t v;
    memcpy(&v, row + i, sizeof v);
    return v;
}

static void row_set_u32(float *row, int i, uint32_t v)
{
    memcpy(row + i, &v, sizeof v);
}

static float ctr_score(const edl_ps_ctr_config *k, const float *row)
{
    return (row[CTR_SHOW] - row[CTR_CLICK]) * k->nonclk_coeff + row[CTR_CLICK] * k->click_coeff;
}

static size_t state_floats(const edl_ps_table_config *c, size_t dim)
{
    switch (c->optimizer) {
    case EDL_PS_ADAGRAD: return dim;
    case EDL_PS_ADAM: return 2 * dim + 2;
    default: return 0;
    }
}

static float initial(const edl_ps_table_config *c, uint64_t key, uint32_t col)
{
    if (c->init == EDL_PS_INIT_ZERO)
        return 0;
    uint64_t h = ps_mix64(c->seed ^ ps_mix64(key) ^ ps_mix64(col + 0x632be59bd9b4e019ull));
    float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
    return (2 * u - 1) * c->init_scale;
}

int ps_table_new(const edl_ps_table_config *cfg, ps_table **out)
{
    ps_table *t = calloc(1, sizeof *t);
    if (!t)
        return EDL_ENOMEM;
    t->cfg = *cfg;
    t->stride = cfg->dim + state_floats(cfg, cfg->dim);
    t->width = ps_push_width(cfg);
    if (cfg->accessor == EDL_PS_ACCESSOR_CTR) {
        t->stride = CTR_W + 1 + state_floats(cfg, 1);
        t->xstride = cfg->dim - 1 + state_floats(cfg, cfg->dim - 1);
    }
    if (cfg->kind == EDL_PS_SPARSE)
        t->sp = calloc(cfg->shards, sizeof *t->sp);
    else
        t->dn = calloc(cfg->shards, sizeof *t->dn);
    if (!t->sp && !t->dn) {
        free(t);
        return EDL_ENOMEM;
    }
    for (uint32_t s = 0; s < cfg->shards; s++)
        pthread_mutex_init(t->sp ? &t->sp[s].mu : &t->dn[s].mu, NULL);
    pthread_mutex_init(&t->shrink_mu, NULL);
    *out = t;
    return 0;
}

static void sparse_free_shard(sparse_shard *s);
static void dense_free_shard(dense_shard *d);

void ps_table_free(ps_table *t)
{
    if (!t)
        return;
    for (uint32_t s = 0; s < t->cfg.shards; s++) {
        if (t->sp)
            sparse_free_shard(&t->sp[s]);
        else
            dense_free_shard(&t->dn[s]);
        pthread_mutex_destroy(t->sp ? &t->sp[s].mu : &t->dn[s].mu);
    }
    free(t->sp);
    free(t->dn);
    pthread_mutex_destroy(&t->shrink_mu);
    free(t);
}

const edl_ps_table_config *ps_table_config(const ps_table *t)
{
    return &t->cfg;
}

uint32_t ps_table_geo_trainers(const ps_table *t)
{
    return __atomic_load_n(&t->cfg.geo_trainers, __ATOMIC_ACQUIRE);
}

bool ps_table_track_geo(ps_table *t, uint32_t trainers)
{
    uint32_t now = ps_table_geo_trainers(t);
    while (now && trainers > now)
        if (__atomic_compare_exchange_n(&t->cfg.geo_trainers, &now, trainers, false,
                                        __ATOMIC_RELEASE, __ATOMIC_ACQUIRE))
            return true;
    return false;
}

/* ---- optimizers ---------------------------------------------------------------------------- */

/* One row of n weights w with its state (layout of state_floats) and gradient g (wire bytes). */
static void apply_row(const edl_ps_table_config *c, float *w, float *st, const uint8_t *g,
                      size_t n)
{
    float lr = c->lr;
    if (c->optimizer == EDL_PS_SGD) {
        for (size_t i = 0; i < n; i++) {
            float gi;
            memcpy(&gi, g + 4 * i, 4);
            w[i] -= lr * gi;
        }
    } else if (c->optimizer == EDL_PS_ADAGRAD) {
        for (size_t i = 0; i < n; i++) {
            float gi;
            memcpy(&gi, g + 4 * i, 4);
            st[i] += gi * gi;
            w[i] -= lr * gi / (sqrtf(st[i]) + c->eps);
        }
    } else {
        float *m = st, *v = st + n, *pw = st + 2 * n;
        pw[0] *= c->beta1;
        pw[1] *= c->beta2;
        float lr_t = lr * sqrtf(1 - pw[1]) / (1 - pw[0]);
        for (size_t i = 0; i < n; i++) {
            float gi;
            memcpy(&gi, g + 4 * i, 4);
            m[i] = c->beta1 * m[i] + (1 - c->beta1) * gi;
            v[i] = c->beta2 * v[i] + (1 - c->beta2) * gi * gi;
            w[i] -= lr_t * m[i] / (sqrtf(v[i]) + c->eps);
        }
    }
}

/* ---- sparse -------------------------------------------------------------------------------- */

/* The slot of a key's hash h (edl_ps_key_shard's mix, its high bits: the low ones chose the
 * shard): where the key is, or the empty slot where it goes. */
static size_t slot_home(uint64_t h, size_t cap)
{
    return (size_t)(h >> 24 ^ h >> 48) & (cap - 1);
}

static size_t find_slot(const slot *slots, size_t cap, uint64_t key, uint64_t h)
{
    size_t j = slot_home(h, cap);
    while (slots[j].row1 && slots[j].key != key)
        j = (j + 1) & (cap - 1);
    return j;
}

/* A shard's new hash (under its lock). Stored atomically: sparse_each reads where the hash is,
 * without the lock, for hints only (a stale address costs a wasted hint, never a fault). */
static void publish_slots(sparse_shard *s, slot *slots, size_t cap)
{
    __atomic_store_n(&s->slots, slots, __ATOMIC_RELAXED);
    __atomic_store_n(&s->cap, cap, __ATOMIC_RELAXED);
}

static int sparse_grow_slots(sparse_shard *s)
{
    size_t cap = s->cap ? s->cap * 2 : 64;
    slot *slots = NULL;
    if (posix_memalign((void **)&slots, 64, cap * sizeof *slots) != 0)
        return EDL_ENOMEM;
    memset(slots, 0, cap * sizeof *slots);
    for (size_t i = 0; i < s->cap; i++)
        if (s->slots[i].row1)
            slots[find_slot(slots, cap, s->slots[i].key, ps_mix64(s->slots[i].key))] = s->slots[i];
    free(s->slots);
    publish_slots(s, slots, cap);
    return 0;
}

/* Room for twice the rows (and their keys and GEO bits). */
static int sparse_grow_rows(const ps_table *t, sparse_shard *s)
{
    size_t cap = s->rows_cap ? s->rows_cap * 2 : 16;
    if (cap >= UINT32_MAX)
        return EDL_ENOMEM;
    float *rows = NULL; /* on cache lines: a row of 16 floats is one line, not two */
    if (posix_memalign((void **)&rows, 64, cap * t->stride * sizeof *rows) == 0) {
        if (s->nrows)
            memcpy(rows, s->rows, s->nrows * t->stride * sizeof *rows);
        free(s->rows);
        s->rows = rows;
    }
    uint64_t *rk = rows ? realloc(s->rowkey, cap * sizeof *rk) : NULL;
    if (rk)
        s->rowkey = rk;
    if (rk && ps_table_geo_trainers(t) && !s->geo)
        s->geo = calloc(1, sizeof *s->geo);
    uint64_t *mask = rk && s->geo ? realloc(s->geo->mask, cap * sizeof *mask) : NULL;
    if (mask)
        s->geo->mask = mask;
    if (!rows || !rk || (ps_table_geo_trainers(t) && !mask))
        return EDL_ENOMEM; /* what grew stays grown: rows_cap is the least of them */
    s->rows_cap = cap;
    return 0;
}

/* The row of key (hash h = ps_mix64(key)), or NULL when absent. */
static float *sparse_find(const ps_table *t, const sparse_shard *s, uint64_t key, uint64_t h)
{
    if (!s->cap)
        return NULL;
    const slot *x = &s->slots[find_slot(s->slots, s->cap, key, h)];
    return x->row1 ? s->rows + (size_t)(x->row1 - 1) * t->stride : NULL;
}

/* n weights at p[at] of columns col.. (initial values), the rest of the stride floats zero
 * but Adam's powers, 1, in the last two. */
static void weights_init(const edl_ps_table_config *c, float *p, size_t stride, uint64_t key,
                         size_t at, uint32_t col, size_t n)
{
    memset(p, 0, stride * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[at + i] = initial(c, key, col + (uint32_t)i);
    if (c->optimizer == EDL_PS_ADAM)
        p[stride - 2] = p[stride - 1] = 1;
}

/* The row of key, created (initial weights, zero state, Adam powers 1) when absent; NULL when
 * out of memory. Under the shard's lock. */
static float *sparse_row(const ps_table *t, sparse_shard *s, uint64_t key, uint64_t h)
{
    float *row = sparse_find(t, s, key, h);
    if (row)
        return row;
    if ((s->nrows + 1) * 10 > s->cap * 7 && sparse_grow_slots(s) != 0)
        return NULL;
    if (s->nrows == s->rows_cap && sparse_grow_rows(t, s) != 0)
        return NULL;
    row = s->rows + s->nrows * t->stride;
    s->rowkey[s->nrows] = key;
    if (s->geo)
        s->geo->mask[s->nrows] = 0;
    s->slots[find_slot(s->slots, s->cap, key, h)] = (slot){key, (uint32_t)++s->nrows};
    /* plain: dim weights from column 0; CTR: no show, click, unseen nor embedx, embed_w */
    weights_init(&t->cfg, row, t->stride, key, t->xstride ? CTR_W : 0, 0,
                 t->xstride ? 1 : t->cfg.dim);
    return row;
}

/* ---- CTR rows: pull, push, embedx ---------------------------------------------------------- */

static float *row_x(const ps_table *t, const sparse_shard *s, const float *row)
{
    uint32_t x1 = row_u32(row, CTR_X);
    return x1 ? s->x + (size_t)(x1 - 1) * t->xstride : NULL;
}

/* An embedx part for row (of key), from the shard's pool: initial weights of columns 1..dim-1.
 * EDL_ENOMEM leaves the row without. */
static int x_create(const ps_table *t, sparse_shard *s, float *row, uint64_t key)
{
    if (s->nx == s->x_cap) {
        size_t cap = s->x_cap ? 2 * s->x_cap : 16;
        float *x = cap < UINT32_MAX ? realloc(s->x, cap * t->xstride * sizeof *x) : NULL;
        if (!x)
            return EDL_ENOMEM;
        s->x = x;
        s->x_cap = cap;
    }
    weights_init(&t->cfg, s->x + s->nx * t->xstride, t->xstride, key, 0, 1, t->cfg.dim - 1);
    row_set_u32(row, CTR_X, (uint32_t)++s->nx);
    return 0;
}

/* dim floats: embed_w, then embedx or zeros. */
static void ctr_pull(const ps_table *t, const sparse_shard *s, const float *row, float *out)
{
    const float *x = row_x(t, s, row);
    size_t n = t->cfg.dim - 1;
    out[0] = row[CTR_W];
    if (x)
        memcpy(out + 1, x, n * sizeof *out);
    else
        memset(out + 1, 0, n * sizeof *out);
}

/* One key's push (wire bytes: show, click, dim gradients): the counts, embed_w's update,
 * embedx's when it exists; then embedx is created if the score has reached the threshold (the
 * gradients that came with this push were for a row without one: ignored, as Paddle does). */
static int ctr_push(const ps_table *t, sparse_shard *s, float *row, uint64_t key,
                    const uint8_t *v)
{
    const edl_ps_table_config *c = &t->cfg;
    float show, click, *x = row_x(t, s, row);
    memcpy(&show, v, 4);
    memcpy(&click, v + 4, 4);
    row[CTR_SHOW] += show;
    row[CTR_CLICK] += click;
    row_set_u32(row, CTR_UNSEEN, 0);
    apply_row(c, row + CTR_W, row + CTR_W + 1, v + 8, 1);
    if (x)
        apply_row(c, x, x + c->dim - 1, v + 12, c->dim - 1);
    else if (ctr_score(&c->ctr, row) >= c->ctr.embedx_threshold)
        return x_create(t, s, row, key);
    return 0;
}

/* The shard of t of hash h. */
static uint32_t shard_of(const ps_table *t, uint64_t h)
{
    return ps_hash_shard(h, t->cfg.shards);
}

/* One key's part of a request, its row found (row, when the lookahead found it) or made (under
 * the shard's lock). */
static int sparse_one(ps_table *t, sparse_shard *s, float *row, uint64_t key, uint64_t h,
                      uint32_t i, float *out, const uint8_t *grads)
{
    size_t dim = t->cfg.dim;
    if (!row)
        row = sparse_row(t, s, key, h);
    if (!row)
        return EDL_ENOMEM;
    if (t->xstride && grads)
        return ctr_push(t, s, row, key, grads + 4 * t->width * i);
    if (t->xstride)
        ctr_pull(t, s, row, out + dim * i);
    else if (grads)
        apply_row(&t->cfg, row, row + dim, grads + 4 * dim * i, dim);
    else if (dim == 1) /* no call for one float */
        out[i] = row[0];
    else
        memcpy(out + dim * i, row, dim * sizeof *out);
    return 0;
}

/* Hints for the cache lines of a row that a pull reads (its dim weights) or a push writes
 * (the whole row), at most 4 lines. */
static void row_hint(const ps_table *t, const float *row, bool push)
{
    size_t bytes = (push || t->xstride ? t->stride : t->cfg.dim) * sizeof *row;
    const char *p = (const char *)row, *end = p + (bytes < 256 ? bytes : 256);
    for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63; a < (uintptr_t)end; a += 64)
        __builtin_prefetch((const void *)a);
}

/* A request's keys go through a software pipeline, one key a step: key i + SLOT_AHEAD is
 * hashed and its slot hinted (no lock: where the shard's hash is, read atomically by
 * publish_slots; a stale address wastes a hint, a prefetch never faults); key i + ROW_AHEAD's
 * shard is locked, its slot looked up (in cache by now) and its row hinted; key i's work is
 * done. On a big table every slot and row is a cache miss; this keeps ~2 * ROW_AHEAD of them
 * in flight, whatever the shards (the client sends keys by shard: ~10 a shard at 10,000 keys
 * a call over 1024 shards, too few to hide a miss behind, so the locks follow the keys: a
 * shard is locked when its first key enters the lookup and unlocked after its last key's
 * work). Locks are taken in ascending shard order only (deadlock-free): a key whose shard is
 * lower than the one before starts a new segment, entered once the one before is done. */
#define SLOT_AHEAD 24
#define ROW_AHEAD 12
#define PIPE 32 /* a ring of the keys in flight: a power of two over SLOT_AHEAD + 1 */

typedef struct sparse_pipe {
    ps_table *t;
    const uint8_t *keys, *grads;
    uint32_t hashed; /* keys hashed and hinted */
    uint32_t looked; /* keys whose shard is locked and row hinted */
    uint32_t end;    /* the segment's end: a key whose shard goes down, or n */
    uint64_t h[PIPE];
    uint32_t sh[PIPE];
    bool apply[PIPE];      /* key's push admitted on its shard (always, for a pull) */
    float *row[PIPE];      /* key's row when looked up (NULL: none yet) ... */
    const float *rows[PIPE]; /* ... valid while its shard's rows are where they were then */
    uint32_t locked[PIPE]; /* the shards locked, ascending, at lo..hi - 1 (mod PIPE) */
    uint32_t lo, hi;
    bool top_apply;        /* the highest locked shard's admission */
    const ps_push_id *id;
    uint64_t req;
} sparse_pipe;

static uint64_t pipe_key(const sparse_pipe *p, uint32_t k)
{
    return edl_get64(p->keys + 8 * (size_t)k);
}

/* Key p->hashed: its hash and shard, its slot hinted; the segment ends there when its shard is
 * lower than the key's before (the check begins at `from`, the segment's first key). */
static void pipe_hash(sparse_pipe *p, uint32_t from)
{
    uint32_t k = p->hashed++;
    uint64_t h = p->h[k % PIPE] = ps_mix64(pipe_key(p, k));
    uint32_t sh = p->sh[k % PIPE] = shard_of(p->t, h);
    if (k > from && sh < p->sh[(k - 1) % PIPE])
        p->end = k;
    const sparse_shard *s = &p->t->sp[sh];
    if (p->grads && (k == from || sh != p->sh[(k - 1) % PIPE]))
        ps_dedup_prefetch(&s->dd, p->id); /* read by the admission when the shard is locked */
    const slot *slots = __atomic_load_n(&s->slots, __ATOMIC_RELAXED);
    size_t cap = __atomic_load_n(&s->cap, __ATOMIC_RELAXED);
    if (cap) {
        __builtin_prefetch(&slots[slot_home(h, cap)]);
        __builtin_prefetch(&slots[(slot_home(h, cap) + SLOTS_A_LINE - 1) & (cap - 1)]);
    }
}

/* Key p->looked: its shard locked (when it is a new one: a push admitted there), its slot
 * looked up and its row hinted. */
static void pipe_look(sparse_pipe *p)
{
    uint32_t k = p->looked++, sh = p->sh[k % PIPE];
    sparse_shard *s = &p->t->sp[sh];
    if (p->lo == p->hi || p->locked[(p->hi - 1) % PIPE] != sh) {
        pthread_mutex_lock(&s->mu);
        p->locked[p->hi++ % PIPE] = sh;
        p->top_apply = !p->grads || ps_dedup_admit(&s->dd, p->id, p->req);
    }
    p->apply[k % PIPE] = p->top_apply;
    p->row[k % PIPE] = NULL;
    if (!p->top_apply || !s->cap)
        return;
    const slot *e = &s->slots[find_slot(s->slots, s->cap, pipe_key(p, k), p->h[k % PIPE])];
    if (!e->row1)
        return;
    p->row[k % PIPE] = s->rows + (size_t)(e->row1 - 1) * p->t->stride;
    p->rows[k % PIPE] = s->rows;
    row_hint(p->t, p->row[k % PIPE], p->grads != NULL);
}

static void pipe_unlock_all(sparse_pipe *p)
{
    while (p->lo != p->hi)
        pthread_mutex_unlock(&p->t->sp[p->locked[p->lo++ % PIPE]].mu);
}

static int sparse_each(ps_table *t, const uint8_t *keys, uint32_t n, float *out,
                       const uint8_t *grads, const ps_push_id *id)
{
    sparse_pipe p = {.t = t, .keys = keys, .grads = grads, .end = n, .id = id,
                     .req = id ? atomic_fetch_add(&next_req, 1) : 0};
    int rc = 0;
    for (uint32_t from = 0; from < n && rc == 0; from = p.end, p.end = n) {
        for (uint32_t i = from; i < p.end && rc == 0; i++) {
            while (p.hashed < p.end && p.hashed <= i + SLOT_AHEAD)
                pipe_hash(&p, from);
            while (p.looked < p.end && p.looked <= i + ROW_AHEAD)
                pipe_look(&p);
            uint32_t sh = p.sh[i % PIPE];
            sparse_shard *s = &t->sp[sh];
            float *row = p.row[i % PIPE] && p.rows[i % PIPE] == s->rows ? p.row[i % PIPE] : NULL;
            if (p.apply[i % PIPE])
                rc = sparse_one(t, s, row, pipe_key(&p, i), p.h[i % PIPE], i, out, grads);
            if (i + 1 == p.end || p.sh[(i + 1) % PIPE] != sh)
                pthread_mutex_unlock(&t->sp[p.locked[p.lo++ % PIPE]].mu);
        }
        pipe_unlock_all(&p); /* after an error */
    }
    return rc;
}

int ps_table_pull_sparse(ps_table *t, const uint8_t *keys, uint32_t n, float *out)
{
    return sparse_each(t, keys, n, out, NULL, NULL);
}

int ps_table_push_sparse(ps_table *t, const uint8_t *keys, uint32_t n, const uint8_t *grads,
                         const ps_push_id *id)
{
    return sparse_each(t, keys, n, NULL, grads, id);
}

/* ---- dense --------------------------------------------------------------------------------- */

static int dense_alloc(const ps_table *t, dense_shard *d, uint32_t s)
{
    const edl_ps_table_config *c = &t->cfg;
    uint64_t start = edl_ps_dense_shard_start(c->size, c->shards, s);
    size_t n = edl_ps_dense_shard_len(c->size, c->shards, s), b = (n ? n : 1) * sizeof(float);
    d->w = malloc(b);
    if (c->optimizer != EDL_PS_SGD)
        d->s1 = calloc(1, b);
    if (c->optimizer == EDL_PS_ADAM) {
        d->s2 = calloc(1, b);
        d->p1 = malloc(b);
        d->p2 = malloc(b);
    }
    bool ok = d->w && (c->optimizer == EDL_PS_SGD || d->s1) &&
              (c->optimizer != EDL_PS_ADAM || (d->s2 && d->p1 && d->p2));
    if (!ok) {
        free(d->w), free(d->s1), free(d->s2), free(d->p1), free(d->p2);
        *d = (dense_shard){.mu = d->mu, .dd = d->dd};
        return EDL_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        d->w[i] = initial(c, start + i, 0);
        if (d->p1)
            d->p1[i] = d->p2[i] = 1;
    }
    return 0;
}

/* The elements [i, i + n) of one dense shard: Adam's powers per element, so a push of part of
 * a table moves only what it touches. */
static void dense_apply(const edl_ps_table_config *c, dense_shard *d, size_t i, size_t n,
                        const uint8_t *g)
{
    if (c->optimizer != EDL_PS_ADAM) {
        apply_row(c, d->w + i, d->s1 ? d->s1 + i : NULL, g, n);
        return;
    }
    for (size_t k = 0; k < n; k++) {
        float st[4] = {d->s1[i + k], d->s2[i + k], d->p1[i + k], d->p2[i + k]};
        apply_row(c, d->w + i + k, st, g + 4 * k, 1);
        d->s1[i + k] = st[0], d->s2[i + k] = st[1], d->p1[i + k] = st[2], d->p2[i + k] = st[3];
    }
}

static int dense_each(ps_table *t, uint64_t off, uint64_t n, float *out, const uint8_t *grads,
                      const ps_push_id *id)
{
    const edl_ps_table_config *c = &t->cfg;
    uint64_t done = 0, req = id ? atomic_fetch_add(&next_req, 1) : 0;
    while (done < n) {
        uint64_t at = off + done;
        uint32_t s = edl_ps_dense_shard(at, c->size, c->shards);
        uint64_t start = edl_ps_dense_shard_start(c->size, c->shards, s);
        uint64_t len = edl_ps_dense_shard_len(c->size, c->shards, s) - (at - start);
        len = len < n - done ? len : n - done;
        dense_shard *d = &t->dn[s];
        pthread_mutex_lock(&d->mu);
        int rc = d->w ? 0 : dense_alloc(t, d, s);
        if (rc == 0 && grads && ps_dedup_admit(&d->dd, id, req))
            dense_apply(c, d, at - start, len, grads + 4 * done);
        else if (rc == 0 && !grads)
            memcpy(out + done, d->w + (at - start), len * sizeof *out);
        pthread_mutex_unlock(&d->mu);
        if (rc)
            return rc;
        done += len;
    }
    return 0;
}

int ps_table_pull_dense(ps_table *t, uint64_t off, uint64_t n, float *out)
{
    return dense_each(t, off, n, out, NULL, NULL);
}

int ps_table_push_dense(ps_table *t, uint64_t off, uint64_t n, const uint8_t *grads,
                        const ps_push_id *id)
{
    return dense_each(t, off, n, NULL, grads, id);
}

/* ---- GEO ----------------------------------------------------------------------------------- */

/* Row changed for trainer u (listed once). */
static int geo_mark_one(geo_shard *g, uint32_t row, uint32_t u)
{
    if (g->mask[row] >> u & 1)
        return 0;
    if (g->n[u] == g->cap[u]) {
        size_t cap = g->cap[u] ? 2 * g->cap[u] : 64;
        uint32_t *l = realloc(g->list[u], cap * sizeof *l);
        if (!l)
            return EDL_ENOMEM;
        g->list[u] = l;
        g->cap[u] = cap;
    }
    g->list[u][g->n[u]++] = row;
    g->mask[row] |= 1ull << u;
    return 0;
}

/* Row changed by `trainer`: changed for every other. */
static int geo_mark(geo_shard *g, uint32_t row, uint32_t trainer, uint32_t trainers)
{
    for (uint32_t u = 0; u < trainers; u++)
        if (u != trainer && geo_mark_one(g, row, u) != 0)
            return EDL_ENOMEM;
    return 0;
}

int ps_table_geo_add(ps_table *t, const uint8_t *keys, uint32_t n, const uint8_t *deltas,
                     uint32_t trainer, const ps_push_id *id)
{
    size_t dim = t->cfg.dim;
    uint64_t req = id ? atomic_fetch_add(&next_req, 1) : 0;
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        uint64_t key = edl_get64(keys + 8 * (size_t)i), h = ps_mix64(key);
        sparse_shard *s = &t->sp[shard_of(t, h)];
        pthread_mutex_lock(&s->mu);
        float *row = ps_dedup_admit(&s->dd, id, req) ? sparse_row(t, s, key, h) : NULL;
        if (row) {
            for (size_t j = 0; j < dim; j++) {
                float d;
                memcpy(&d, deltas + 4 * (dim * i + j), 4);
                row[j] += d;
            }
            rc = geo_mark(s->geo, (uint32_t)((row - s->rows) / t->stride), trainer,
                          ps_table_geo_trainers(t));
        } else if (ps_dedup_admit(&s->dd, id, req)) { /* admitted (this request), yet no row */
            rc = EDL_ENOMEM;
        }
        pthread_mutex_unlock(&s->mu);
    }
    return rc;
}

uint32_t ps_table_geo_take(ps_table *t, uint32_t trainer, uint32_t max, uint8_t *keys,
                           float *rows, bool *more)
{
    size_t dim = t->cfg.dim;
    uint32_t got = 0;
    *more = false;
    for (uint32_t sh = 0; sh < t->cfg.shards; sh++) {
        sparse_shard *s = &t->sp[sh];
        pthread_mutex_lock(&s->mu);
        geo_shard *g = s->geo;
        while (g && g->n[trainer] && got < max) {
            uint32_t row = g->list[trainer][--g->n[trainer]];
            g->mask[row] &= ~(1ull << trainer);
            edl_put64(keys + 8 * (size_t)got, s->rowkey[row]);
            memcpy(rows + dim * got++, s->rows + (size_t)row * t->stride, dim * sizeof *rows);
        }
        *more |= g && g->n[trainer] > 0;
        pthread_mutex_unlock(&s->mu);
    }
    return got;
}

/* ---- for single owners: the trainer's merge buffers and local copies ------------------------ */

float *ps_table_row(ps_table *t, uint64_t key, bool create)
{
    uint64_t h = ps_mix64(key);
    sparse_shard *s = &t->sp[shard_of(t, h)];
    return create ? sparse_row(t, s, key, h) : sparse_find(t, s, key, h);
}

void ps_table_reset(ps_table *t)
{
    for (uint32_t sh = 0; sh < t->cfg.shards; sh++) {
        if (t->sp) {
            sparse_shard *s = &t->sp[sh];
            if (s->cap)
                memset(s->slots, 0, s->cap * sizeof *s->slots);
            s->nrows = s->nx = 0;
        } else if (t->dn[sh].w) {
            memset(t->dn[sh].w, 0, edl_ps_dense_shard_len(t->cfg.size, t->cfg.shards, sh) *
                                        sizeof(float));
        }
    }
}

int ps_table_foreach(ps_table *t, ps_rows_fn fn, void *arg)
{
    int rc = 0;
    for (uint32_t sh = 0; sh < t->cfg.shards && rc == 0; sh++) {
        if (t->sp) {
            sparse_shard *s = &t->sp[sh];
            pthread_mutex_lock(&s->mu);
            if (s->nrows)
                rc = fn(arg, s->rowkey, 0, s->rows, s->nrows, t->stride);
            pthread_mutex_unlock(&s->mu);
        } else if (t->dn[sh].w) {
            dense_shard *d = &t->dn[sh];
            pthread_mutex_lock(&d->mu);
            rc = fn(arg, NULL, edl_ps_dense_shard_start(t->cfg.size, t->cfg.shards, sh), d->w,
                    edl_ps_dense_shard_len(t->cfg.size, t->cfg.shards, sh), 1);
            pthread_mutex_unlock(&d->mu);
        }
    }
    return rc;
}

/* ---- sync: a step's summed gradients -------------------------------------------------------- */

static int push_rows(void *target, const uint64_t *keys, uint64_t start, float *rows,
                     size_t n, size_t stride)
{
    (void)stride; /* SGD without state: the rows are the wire's gradient layout */
    if (keys)
        return ps_table_push_sparse(target, (const uint8_t *)keys, (uint32_t)n,
                                    (const uint8_t *)rows, NULL);
    return ps_table_push_dense(target, start, n, (const uint8_t *)rows, NULL);
}

int ps_table_apply_to(ps_table *sum, ps_table *target)
{
    return ps_table_foreach(sum, push_rows, target);
}

void ps_sum_config(const edl_ps_table_config *cfg, edl_ps_table_config *out)
{
    *out = *cfg;
    out->dim = cfg->kind == EDL_PS_SPARSE ? ps_push_width(cfg) : cfg->dim;
    out->optimizer = EDL_PS_SGD;
    out->lr = -1; /* w -= lr g: adds */
    out->init = EDL_PS_INIT_ZERO;
    out->geo_trainers = 0;
    out->accessor = EDL_PS_ACCESSOR_PLAIN;
}

void ps_table_stats(ps_table *t, uint64_t *rows, uint64_t *bytes)
{
    uint64_t r = 0, b = 0;
    size_t per_elem = 1 + state_floats(&t->cfg, 1); /* the dense arrays of dense_alloc */
    for (uint32_t s = 0; s < t->cfg.shards; s++) {
        if (t->sp) {
            sparse_shard *x = &t->sp[s];
            pthread_mutex_lock(&x->mu);
            r += x->nrows;
            b += x->cap * sizeof *x->slots +
                 x->rows_cap * (t->stride * sizeof(float) + sizeof *x->rowkey +
                                (x->geo ? sizeof *x->geo->mask : 0)) +
                 x->x_cap * t->xstride * sizeof(float);
            pthread_mutex_unlock(&x->mu);
        } else {
            dense_shard *d = &t->dn[s];
            pthread_mutex_lock(&d->mu);
            if (d->w)
                b += edl_ps_dense_shard_len(t->cfg.size, t->cfg.shards, s) * per_elem *
                     sizeof(float);
            pthread_mutex_unlock(&d->mu);
        }
    }
    *rows = r;
    *bytes = b;
}

/* ---- CTR: the shrink step ------------------------------------------------------------------- */

/* The least capacities for n rows, as they grow: rows (and pool parts) from 16, doubling; hash
 * slots from 64, doubling, at a load of at most 0.7 with room for one more row. */
static size_t fit_rows(size_t n)
{
    size_t cap = 16;
    while (cap < n)
        cap *= 2;
    return cap;
}

static size_t fit_slots(size_t n)
{
    size_t cap = 64;
    while ((n + 1) * 10 > cap * 7)
        cap *= 2;
    return cap;
}

/* The embedx parts of the rows left (nx of them) into a pool of their size, in row order. Out
 * of memory: the old pool stays, dead parts and all, until the next shrink. */
static void x_compact(const ps_table *t, sparse_shard *s, size_t nx)
{
    size_t cap = nx ? fit_rows(nx) : 0, j = 0;
    float *pool = cap ? malloc(cap * t->xstride * sizeof *pool) : NULL;
    if (cap && !pool)
        return;
    for (size_t i = 0; i < s->nrows; i++) {
        float *row = s->rows + i * t->stride, *x = row_x(t, s, row);
        if (!x)
            continue;
        memcpy(pool + j * t->xstride, x, t->xstride * sizeof *pool);
        row_set_u32(row, CTR_X, (uint32_t)++j);
    }
    free(s->x);
    s->x = pool;
    s->nx = j;
    s->x_cap = cap;
}

/* The row arrays cut to the rows left, and the hash built again for them (smaller when it can
 * be; out of memory, in the arrays there are). */
static void rows_fit(const ps_table *t, sparse_shard *s)
{
    size_t cap = fit_rows(s->nrows);
    uint64_t *rk = cap < s->rows_cap ? realloc(s->rowkey, cap * sizeof *rk) : NULL;
    if (rk) {
        float *rows = realloc(s->rows, cap * t->stride * sizeof *rows);
        s->rowkey = rk;
        s->rows = rows ? rows : s->rows; /* else bigger than needed: still at least cap */
        s->rows_cap = cap;
    }
    cap = fit_slots(s->nrows);
    slot *slots = cap < s->cap ? calloc(cap, sizeof *slots) : NULL;
    if (slots) {
        free(s->slots);
        publish_slots(s, slots, cap);
    } else {
        memset(s->slots, 0, s->cap * sizeof *s->slots);
    }
    for (size_t i = 0; i < s->nrows; i++) {
        uint64_t key = s->rowkey[i];
        s->slots[find_slot(s->slots, s->cap, key, ps_mix64(key))] = (slot){key, (uint32_t)i + 1};
    }
}

/* Decay and age every row of a shard, delete the dead ones and give their memory back: the
 * rows left move down in place, then their embedx parts and their hash are made again at the
 * size they need. Under the shard's lock. Returns the rows deleted. */
static size_t ctr_shrink_shard(const ps_table *t, sparse_shard *s)
{
    const edl_ps_ctr_config *k = &t->cfg.ctr;
    size_t n = s->nrows, kept = 0, nx = 0;
    for (size_t i = 0; i < n; i++) {
        float *row = s->rows + i * t->stride;
        uint32_t unseen = row_u32(row, CTR_UNSEEN);
        unseen += unseen < UINT32_MAX;
        row_set_u32(row, CTR_UNSEEN, unseen);
        row[CTR_SHOW] *= k->show_click_decay_rate;
        row[CTR_CLICK] *= k->show_click_decay_rate;
        if (ctr_score(k, row) < k->delete_threshold || unseen > k->delete_after_unseen_days)
            continue;
        nx += row_u32(row, CTR_X) != 0;
        if (kept != i) {
            memcpy(s->rows + kept * t->stride, row, t->stride * sizeof *row);
            s->rowkey[kept] = s->rowkey[i];
        }
        kept++;
    }
    s->nrows = kept;
    if (!kept) {
        sparse_free_shard(s);
        return n;
    }
    x_compact(t, s, nx);
    rows_fit(t, s);
    return n - kept;
}

int ps_table_shrink(ps_table *t, uint64_t token, bool (*serves)(void *arg, uint32_t shard),
                    void *arg, uint64_t *evicted, uint64_t *left)
{
    if (!t->xstride)
        return EDL_EINVAL;
    pthread_mutex_lock(&t->shrink_mu);
    if (!t->shrunk || t->shrink_token != token) {
        uint64_t ev = 0, kept = 0;
        for (uint32_t sh = 0; sh < t->cfg.shards; sh++) {
            sparse_shard *s = &t->sp[sh];
            if (serves && !serves(arg, sh))
                continue;
            pthread_mutex_lock(&s->mu);
            ev += ctr_shrink_shard(t, s);
            kept += s->nrows;
            pthread_mutex_unlock(&s->mu);
        }
        t->shrunk = true;
        t->shrink_token = token;
        t->shrink_evicted = ev;
        t->shrink_left = kept;
    }
    *evicted = t->shrink_evicted;
    *left = t->shrink_left;
    pthread_mutex_unlock(&t->shrink_mu);
    return 0;
}

/* ---- moving a shard: its bytes out of one server and into another ---------------------------
 * sparse: n(4) stride(4) geo(4) xstride(4) pushes(4) 0(4) keys(8 n) rows(4 n stride)
 *         [GEO change bits(8 n)] [CTR: the embedx parts (4 xstride each) of the rows that
 *         have one, in row order; a row's x field holds 1 when it has one, else 0; plain
 *         tables have xstride 0], then the pushes it applied: {client token(8) seq(8)} x pushes
 * dense:  elements(4, 0: never touched) arrays(4) pushes(4) 0(4) the arrays w, s1, s2, p1,
 *         p2 that the optimizer has (4 elements each), then the pushes */

#define SPARSE_HEAD 24

static size_t dense_arrays(const edl_ps_table_config *c)
{
    return c->optimizer == EDL_PS_ADAM ? 5 : c->optimizer == EDL_PS_ADAGRAD ? 2 : 1;
}

static void sparse_free_shard(sparse_shard *s)
{
    free(s->slots), free(s->rows), free(s->rowkey), free(s->x);
    ps_dedup_free(&s->dd);
    for (int i = 0; s->geo && i < EDL_PS_MAX_GEO_TRAINERS; i++)
        free(s->geo->list[i]);
    if (s->geo)
        free(s->geo->mask);
    free(s->geo);
    *s = (sparse_shard){.mu = s->mu};
}

static void dense_free_shard(dense_shard *d)
{
    free(d->w), free(d->s1), free(d->s2), free(d->p1), free(d->p2);
    ps_dedup_free(&d->dd);
    *d = (dense_shard){.mu = d->mu};
}

/* A CTR shard's exported rows: x fields as flags, and the embedx parts after them at xs. */
static void ctr_export(const ps_table *t, const sparse_shard *s, uint8_t *rows, uint8_t *xs)
{
    for (size_t i = 0; i < s->nrows; i++) {
        const float *x = row_x(t, s, s->rows + i * t->stride);
        edl_put32(rows + 4 * (i * t->stride + CTR_X), x != NULL);
        if (x) {
            memcpy(xs, x, 4 * t->xstride);
            xs += 4 * t->xstride;
        }
    }
}

/* Why a shard's pushes (its clients' memory) were not taken. */
static int dedup_refused(int rc, uint64_t n, char *why, size_t whylen)
{
    if (rc == EDL_ENOMEM)
        return edl_errf(why, whylen, rc, "out of memory for a shard's %llu pushes",
                        (unsigned long long)n);
    return edl_errf(why, whylen, rc, "a shard's %llu pushes: more than %d, a client named twice "
                    "or a push numbered 0", (unsigned long long)n, PS_DEDUP_MAX);
}

static uint8_t *sparse_export(const ps_table *t, const sparse_shard *s, size_t *len)
{
    size_t n = s->nrows, geo = ps_table_geo_trainers(t) > 0, nx = 0, rb = 4 * n * t->stride;
    for (size_t i = 0; t->xstride && i < n; i++)
        nx += row_u32(s->rows + i * t->stride, CTR_X) != 0;
    size_t body = n * (8 + 4 * t->stride + 8 * geo) + 4 * nx * t->xstride;
    *len = SPARSE_HEAD + body + ps_dedup_bytes(&s->dd);
    uint8_t *p = malloc(*len), *q = p + SPARSE_HEAD;
    if (!p)
        return NULL;
    edl_put32(p, (uint32_t)n), edl_put32(p + 4, (uint32_t)t->stride);
    edl_put32(p + 8, (uint32_t)geo), edl_put32(p + 12, (uint32_t)t->xstride);
    edl_put32(p + 16, s->dd.n), edl_put32(p + 20, 0);
    ps_dedup_put(&s->dd, q + body);
    if (n == 0) /* an empty shard has no arrays */
        return p;
    memcpy(q, s->rowkey, 8 * n);
    memcpy(q + 8 * n, s->rows, rb);
    if (geo)
        memcpy(q + 8 * n + rb, s->geo->mask, 8 * n);
    if (t->xstride)
        ctr_export(t, s, q + 8 * n, q + 8 * n + rb);
    return p;
}

static uint8_t *dense_export(const ps_table *t, const dense_shard *d, uint32_t sh, size_t *len)
{
    size_t n = d->w ? edl_ps_dense_shard_len(t->cfg.size, t->cfg.shards, sh) : 0;
    size_t na = dense_arrays(&t->cfg);
    float *arr[5] = {d->w, d->s1, d->s2, d->p1, d->p2};
    *len = 16 + 4 * n * na + ps_dedup_bytes(&d->dd);
    uint8_t *p = malloc(*len);
    if (!p)
        return NULL;
    edl_put32(p, (uint32_t)n), edl_put32(p + 4, (uint32_t)na);
    edl_put32(p + 8, d->dd.n), edl_put32(p + 12, 0);
    for (size_t a = 0; a < na && n; a++)
        memcpy(p + 16 + 4 * n * a, arr[a], 4 * n);
    ps_dedup_put(&d->dd, p + 16 + 4 * n * na);
    return p;
}

int ps_table_shard_export(ps_table *t, uint32_t sh, bool drop, uint8_t **out, size_t *len)
{
    pthread_mutex_t *mu = t->sp ? &t->sp[sh].mu : &t->dn[sh].mu;
    pthread_mutex_lock(mu);
    *out = t->sp ? sparse_export(t, &t->sp[sh], len) : dense_export(t, &t->dn[sh], sh, len);
    if (*out && drop && t->sp)
        sparse_free_shard(&t->sp[sh]);
    else if (*out && drop)
        dense_free_shard(&t->dn[sh]);
    pthread_mutex_unlock(mu);
    return *out ? 0 : EDL_ENOMEM;
}

/* The embedx parts a CTR shard's bytes carry (rows: its rows, n of them), or -1 when a row's
 * flag is neither 0 nor 1. */
static int64_t ctr_parts(const ps_table *t, const uint8_t *rows, uint64_t n)
{
    int64_t nx = 0;
    for (uint64_t i = 0; t->xstride && i < n; i++) {
        uint32_t has = edl_get32(rows + 4 * (i * t->stride + CTR_X));
        if (has > 1)
            return -1;
        nx += has;
    }
    return nx;
}

/* An imported CTR row's embedx part, at *xs when its flag says it has one (then past it). */
static int ctr_import(const ps_table *t, sparse_shard *s, float *row, const uint8_t **xs)
{
    if (!row_u32(row, CTR_X))
        return 0;
    row_set_u32(row, CTR_X, 0);
    if (x_create(t, s, row, 0) != 0)
        return EDL_ENOMEM;
    memcpy(row_x(t, s, row), *xs, 4 * t->xstride);
    *xs += 4 * t->xstride;
    return 0;
}

static int sparse_import(ps_table *t, sparse_shard *s, uint32_t sh, const uint8_t *p, size_t len,
                         char *why, size_t whylen)
{
    uint64_t n = edl_get32(p), stride = edl_get32(p + 4), geo = edl_get32(p + 8);
    uint64_t xstride = edl_get32(p + 12), np = edl_get32(p + 16);
    uint64_t fixed = SPARSE_HEAD + n * (8 + 4 * stride + 8 * geo);
    int64_t nx = stride == t->stride && fixed <= len ? ctr_parts(t, p + SPARSE_HEAD + 8 * n, n)
                                                     : 0;
    bool is_geo = ps_table_geo_trainers(t) > 0;
    if (stride != t->stride || geo != is_geo || xstride != t->xstride || nx < 0 ||
        edl_get32(p + 20) || len != fixed + 4 * (uint64_t)nx * xstride + 16 * np)
        return edl_errf(why, whylen, EDL_EPROTO, "a sparse shard of %llu rows of %llu floats "
                        "(embedx parts of %llu%s) and %llu pushes in %zu bytes, for a table "
                        "of rows of %zu (embedx parts of %zu)", (unsigned long long)n,
                        (unsigned long long)stride, (unsigned long long)xstride,
                        nx < 0 ? ", an embedx flag neither 0 nor 1" : "",
                        (unsigned long long)np, len, t->stride, t->xstride);
    const uint8_t *keys = p + SPARSE_HEAD, *rows = keys + 8 * n, *mask = rows + 4 * n * stride;
    const uint8_t *xs = mask + 8 * n * geo;
    int rc = ps_dedup_get(&s->dd, p + fixed + 4 * (uint64_t)nx * xstride, (uint32_t)np);
    if (rc)
        return dedup_refused(rc, np, why, whylen);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t key = edl_get64(keys + 8 * i), h = ps_mix64(key);
        if (shard_of(t, h) != sh || sparse_find(t, s, key, h))
            return edl_errf(why, whylen, EDL_EPROTO, "key %llu %s shard %u",
                            (unsigned long long)key, shard_of(t, h) != sh ? "is not of"
                            : "comes twice in", sh);
        float *row = sparse_row(t, s, key, h);
        if (!row)
            return edl_errf(why, whylen, EDL_ENOMEM, "out of memory for shard %u", sh);
        memcpy(row, rows + 4 * stride * i, 4 * stride);
        if (t->xstride && ctr_import(t, s, row, &xs) != 0)
            return edl_errf(why, whylen, EDL_ENOMEM, "out of memory for shard %u", sh);
        uint32_t r = (uint32_t)((row - s->rows) / t->stride);
        for (uint32_t u = 0, nu = ps_table_geo_trainers(t); geo && u < nu; u++)
            if (edl_get64(mask + 8 * i) >> u & 1 && geo_mark_one(s->geo, r, u) != 0)
                return edl_errf(why, whylen, EDL_ENOMEM, "out of memory for shard %u", sh);
    }
    return 0;
}

static int dense_import(ps_table *t, dense_shard *d, uint32_t sh, const uint8_t *p, size_t len,
                        char *why, size_t whylen)
{
    uint64_t n = edl_get32(p), na = edl_get32(p + 4), np = edl_get32(p + 8);
    uint64_t want = edl_ps_dense_shard_len(t->cfg.size, t->cfg.shards, sh);
    if ((n != 0 && n != want) || na != dense_arrays(&t->cfg) || edl_get32(p + 12) ||
        len != 16 + 4 * n * na + 16 * np)
        return edl_errf(why, whylen, EDL_EPROTO, "a dense shard of %llu elements in %llu arrays "
                        "and %llu pushes (%zu bytes), for a shard of %llu in %zu",
                        (unsigned long long)n, (unsigned long long)na, (unsigned long long)np,
                        len, (unsigned long long)want, dense_arrays(&t->cfg));
    int rc = ps_dedup_get(&d->dd, p + 16 + 4 * n * na, (uint32_t)np);
    if (rc)
        return dedup_refused(rc, np, why, whylen);
    if (n == 0)
        return 0;
    if (dense_alloc(t, d, sh) != 0)
        return edl_errf(why, whylen, EDL_ENOMEM, "out of memory for shard %u", sh);
    float *arr[5] = {d->w, d->s1, d->s2, d->p1, d->p2};
    for (size_t a = 0; a < na; a++)
        memcpy(arr[a], p + 16 + 4 * n * a, 4 * n);
    return 0;
}

int ps_table_shard_import(ps_table *t, uint32_t sh, const uint8_t *p, size_t len, char *why,
                          size_t whylen)
{
    if (len < (t->sp ? SPARSE_HEAD : 16u))
        return edl_errf(why, whylen, EDL_EPROTO, "a shard of %zu bytes", len);
    pthread_mutex_t *mu = t->sp ? &t->sp[sh].mu : &t->dn[sh].mu;
    pthread_mutex_lock(mu);
    int rc;
    if (t->sp) {
        sparse_free_shard(&t->sp[sh]);
        if ((rc = sparse_import(t, &t->sp[sh], sh, p, len, why, whylen)) != 0)
            sparse_free_shard(&t->sp[sh]);
    } else {
        dense_free_shard(&t->dn[sh]);
        if ((rc = dense_import(t, &t->dn[sh], sh, p, len, why, whylen)) != 0)
            dense_free_shard(&t->dn[sh]);
    }
    pthread_mutex_unlock(mu);
    return rc;
}

bool ps_table_shard_empty(ps_table *t, uint32_t sh)
{
    pthread_mutex_t *mu = t->sp ? &t->sp[sh].mu : &t->dn[sh].mu;
    pthread_mutex_lock(mu);
    bool empty = t->sp ? t->sp[sh].nrows == 0 : t->dn[sh].w == NULL;
    pthread_mutex_unlock(mu);
    return empty;
}

void ps_table_shard_drop(ps_table *t, uint32_t sh)
{
    pthread_mutex_t *mu = t->sp ? &t->sp[sh].mu : &t->dn[sh].mu;
    pthread_mutex_lock(mu);
    if (t->sp)
        sparse_free_shard(&t->sp[sh]);
    else
        dense_free_shard(&t->dn[sh]);
    pthread_mutex_unlock(mu);
}
