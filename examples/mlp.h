/* mlp.h: the data set and the model of examples/elastic_mlp, shared with examples/distill
 * (whose teacher serves this model): 16-dimensional inputs uniform in [-1, 1], labelled with
 * the argmax of a fixed random linear map (4 classes), 4096 training and 1024 test samples
 * from a fixed seed; the model is 16 -> 64 (ReLU) -> 4 with softmax cross-entropy. Everything
 * is deterministic: the same calls give the same floats in every process. */
#ifndef EDL_EXAMPLES_MLP_H
#define EDL_EXAMPLES_MLP_H

#include <math.h>
#include <stdint.h>

enum { D = 16, H = 64, C = 4, NTRAIN = 4096, NTEST = 1024, BATCH = 32 };
enum { NP = H * D + H + C * H + C }; /* W1, b1, W2, b2 in one vector */

typedef struct data {
    float x[NTRAIN + NTEST][D];
    int y[NTRAIN + NTEST];
} data;

static uint64_t rng_state __attribute__((unused)) = 0x9e3779b97f4a7c15ull;

static inline float uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}

static inline void make_data(data *d)
{
    float teacher[C][D];
    rng_state = 20261122;
    for (int c = 0; c < C; c++)
        for (int j = 0; j < D; j++)
            teacher[c][j] = uniform();
    for (int i = 0; i < NTRAIN + NTEST; i++) {
        float best = -1e30f;
        for (int j = 0; j < D; j++)
            d->x[i][j] = uniform();
        for (int c = 0; c < C; c++) {
            float z = 0;
            for (int j = 0; j < D; j++)
                z += teacher[c][j] * d->x[i][j];
            if (z > best) {
                best = z;
                d->y[i] = c;
            }
        }
    }
}

static inline void init_params(float *p)
{
    rng_state = 42;
    for (int i = 0; i < H * D; i++)
        p[i] = uniform() / sqrtf(D);
    for (int i = 0; i < C * H; i++)
        p[H * D + H + i] = uniform() / sqrtf(H);
}

/* Forward one sample; with g, add its gradient. Returns its loss; *hit = prediction right. */
static inline float sample(const float *p, float *g, const float *x, int y, int *hit)
{
    const float *w1 = p, *b1 = p + H * D, *w2 = b1 + H, *b2 = w2 + C * H;
    float h[H], z[C], m = -1e30f, s = 0;
    for (int k = 0; k < H; k++) {
        float a = b1[k];
        for (int j = 0; j < D; j++)
            a += w1[k * D + j] * x[j];
        h[k] = a > 0 ? a : 0;
    }
    int arg = 0;
    for (int c = 0; c < C; c++) {
        z[c] = b2[c];
        for (int k = 0; k < H; k++)
            z[c] += w2[c * H + k] * h[k];
        if (z[c] > m) {
            m = z[c];
            arg = c;
        }
    }
    for (int c = 0; c < C; c++)
        s += expf(z[c] - m);
    *hit = arg == y;
    float loss = logf(s) - (z[y] - m);
    if (!g)
        return loss;
    float *gw1 = g, *gb1 = g + H * D, *gw2 = gb1 + H, *gb2 = gw2 + C * H, dh[H] = {0};
    for (int c = 0; c < C; c++) {
        float dz = expf(z[c] - m) / s - (c == y);
        gb2[c] += dz;
        for (int k = 0; k < H; k++) {
            gw2[c * H + k] += dz * h[k];
            dh[k] += dz * w2[c * H + k];
        }
    }
    for (int k = 0; k < H; k++) {
        if (h[k] <= 0)
            continue;
        gb1[k] += dh[k];
        for (int j = 0; j < D; j++)
            gw1[k * D + j] += dh[k] * x[j];
    }
    return loss;
}

static inline float accuracy(const data *d, const float *p, float *loss)
{
    int hits = 0;
    double l = 0;
    for (int i = NTRAIN; i < NTRAIN + NTEST; i++) {
        int hit;
        l += sample(p, NULL, d->x[i], d->y[i], &hit);
        hits += hit;
    }
    *loss = (float)(l / NTEST);
    return (float)hits / NTEST;
}

/* The model's class probabilities (softmax) for one sample. */
static inline void mlp_probs(const float *p, const float *x, float *out)
{
    const float *w1 = p, *b1 = p + H * D, *w2 = b1 + H, *b2 = w2 + C * H;
    float h[H], m = -1e30f, s = 0;
    for (int k = 0; k < H; k++) {
        float a = b1[k];
        for (int j = 0; j < D; j++)
            a += w1[k * D + j] * x[j];
        h[k] = a > 0 ? a : 0;
    }
    for (int c = 0; c < C; c++) {
        out[c] = b2[c];
        for (int k = 0; k < H; k++)
            out[c] += w2[c * H + k] * h[k];
        m = out[c] > m ? out[c] : m;
    }
    for (int c = 0; c < C; c++)
        s += out[c] = expf(out[c] - m);
    for (int c = 0; c < C; c++)
        out[c] /= s;
}

#endif
