/* dtype.c: element types and the reduction kernels of libedlcoll. Half-precision types are
 * reduced in float32 and rounded back to nearest even, so a sum of two halves is exact to the
 * half's precision whatever the order of the ranks. */
#include <stdint.h>
#include <string.h>

#include "internal.h"

size_t edl_dtype_size(edl_dtype dt)
{
    switch (dt) {
    case EDL_FLOAT32: return 4;
    case EDL_FLOAT16: return 2;
    case EDL_BFLOAT16: return 2;
    case EDL_INT32: return 4;
    case EDL_INT64: return 8;
    case EDL_UINT8: return 1;
    }
    return 0;
}

const char *edl_dtype_name(edl_dtype dt)
{
    switch (dt) {
    case EDL_FLOAT32: return "float32";
    case EDL_FLOAT16: return "float16";
    case EDL_BFLOAT16: return "bfloat16";
    case EDL_INT32: return "int32";
    case EDL_INT64: return "int64";
    case EDL_UINT8: return "uint8";
    }
    return "unknown";
}

const char *coll_redop_name(edl_redop op)
{
    switch (op) {
    case EDL_SUM: return "sum";
    case EDL_AVG: return "avg";
    case EDL_MAX: return "max";
    }
    return "unknown";
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float coll_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) /* inf / nan */
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        float f = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24 */
        return sign ? -f : f;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t coll_float_to_half(float f)
{
    uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000;
    uint32_t exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    if (exp == 0xff) /* inf stays inf, nan stays a (quiet) nan */
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00); /* overflow: inf */
    if (e <= 0) {                         /* subnormal half or zero */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        int shift = 14 - e;
        uint32_t half = man >> shift, rest = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13), rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
        half++; /* may carry into the exponent, up to inf: still correct */
    return (uint16_t)(sign | half);
}

float coll_bf16_to_float(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}

uint16_t coll_float_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffff))
        return (uint16_t)((u >> 16) | 0x40); /* quiet nan */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* dst[i] = a[i] op b[i]; dst may alias a or b. */
#define REDUCE_LOOP(T, EXPR)                                                                   \
    do {                                                                                       \
        T *d = dst;                                                                            \
        const T *x = a, *y = b;                                                                \
        for (size_t i = 0; i < n; i++) {                                                       \
            T p = x[i], q = y[i];                                                              \
            d[i] = (EXPR);                                                                     \
        }                                                                                      \
    } while (0)

#define REDUCE_HALF(TO_F, FROM_F)                                                              \
    do {                                                                                       \
        uint16_t *d = dst;                                                                     \
        const uint16_t *x = a, *y = b;                                                         \
        for (size_t i = 0; i < n; i++) {                                                       \
            float p = TO_F(x[i]), q = TO_F(y[i]);                                              \
            d[i] = FROM_F(max ? ((p != p || p > q) ? p : q) : p + q);             \
        }                                                                                      \
    } while (0)

void coll_reduce(void *dst, const void *a, const void *b, size_t n, edl_dtype dt, edl_redop op)
{
    bool max = op == EDL_MAX;
    switch (dt) {
    case EDL_FLOAT32:
        if (max)
            REDUCE_LOOP(float, (p != p || p > q) ? p : q); /* NaN wins, as in NCCL */
        else
            REDUCE_LOOP(float, p + q);
        break;
    case EDL_FLOAT16: REDUCE_HALF(coll_half_to_float, coll_float_to_half); break;
    case EDL_BFLOAT16: REDUCE_HALF(coll_bf16_to_float, coll_float_to_bf16); break;
    case EDL_INT32:
        if (max)
            REDUCE_LOOP(int32_t, p > q ? p : q);
        else /* wraps like two's complement hardware, without signed-overflow UB */
            REDUCE_LOOP(int32_t, (int32_t)((uint32_t)p + (uint32_t)q));
        break;
    case EDL_INT64:
        if (max)
            REDUCE_LOOP(int64_t, p > q ? p : q);
        else
            REDUCE_LOOP(int64_t, (int64_t)((uint64_t)p + (uint64_t)q));
        break;
    case EDL_UINT8: break; /* rejected before any reduction */
    }
}

void coll_scale_avg(void *buf, size_t n, edl_dtype dt, int world)
{
    switch (dt) {
    case EDL_FLOAT32: {
        float *p = buf, w = (float)world;
        for (size_t i = 0; i < n; i++)
            p[i] /= w;
        break;
    }
    case EDL_FLOAT16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = coll_float_to_half(coll_half_to_float(p[i]) / (float)world);
        break;
    }
    case EDL_BFLOAT16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = coll_float_to_bf16(coll_bf16_to_float(p[i]) / (float)world);
        break;
    }
    case EDL_INT32: {
        int32_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] /= world;
        break;
    }
    case EDL_INT64: {
        int64_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] /= world;
        break;
    }
    case EDL_UINT8: break;
    }
}
