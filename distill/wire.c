/* wire.c: the two forms a batch travels in between a student and a teacher (edl/distill.h,
 * docs/distill.md): edl's binary tensor ("EDLT" head, then float32) and TensorFlow Serving's
 * REST JSON. Both decoders read bytes from the network: every shape is checked against the
 * limits before a float is allocated, both forms carry finite floats only (NaN and infinity
 * are refused both ways), and the JSON reader takes exactly the documented form
 * (two passes over the text: the first checks it and counts, the second fills). */
#define _GNU_SOURCE
#include "distill/wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- binary ------------------------------------------------------------------------------ */

static void put_u32(uint8_t *b, uint32_t v)
{
    b[0] = (uint8_t)v, b[1] = (uint8_t)(v >> 8), b[2] = (uint8_t)(v >> 16), b[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static bool shape_ok(uint32_t rows, uint32_t cols)
{
    return rows >= 1 && cols >= 1 && rows <= EDL_DISTILL_MAX_ROWS && cols <= EDL_DISTILL_MAX_COLS &&
           DISTILL_HEAD + (uint64_t)rows * cols * 4 <= EDL_DISTILL_MAX_BODY;
}

static int encode_binary(const float *x, uint32_t rows, uint32_t cols, char **body, size_t *len)
{
    size_t n = (size_t)rows * cols;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return EDL_EINVAL; /* as in JSON, which cannot write them */
    uint8_t *b = malloc(DISTILL_HEAD + 4 * n);
    if (!b)
        return EDL_ENOMEM;
    memcpy(b, DISTILL_MAGIC, 4);
    put_u32(b + 4, DISTILL_VERSION);
    put_u32(b + 8, rows);
    put_u32(b + 12, cols);
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, &x[i], 4);
        put_u32(b + DISTILL_HEAD + 4 * i, v);
    }
    *body = (char *)b;
    *len = DISTILL_HEAD + 4 * n;
    return 0;
}

static int decode_binary(const uint8_t *b, size_t len, float **x, uint32_t *rows, uint32_t *cols,
                         char *err, size_t errlen)
{
    if (len < DISTILL_HEAD)
        return edl_errf(err, errlen, EDL_EPROTO, "binary tensor: %zu bytes, shorter than its "
                        "16-byte head", len);
    if (memcmp(b, DISTILL_MAGIC, 4) != 0)
        return edl_errf(err, errlen, EDL_EPROTO, "binary tensor: no \"EDLT\" magic");
    if (get_u32(b + 4) != DISTILL_VERSION)
        return edl_errf(err, errlen, EDL_EPROTO, "binary tensor: version %u (this build reads 1)",
                        get_u32(b + 4));
    uint32_t r = get_u32(b + 8), c = get_u32(b + 12);
    if (!shape_ok(r, c))
        return edl_errf(err, errlen, r && c ? EDL_ETOOBIG : EDL_EPROTO, "binary tensor: shape "
                        "%u x %u is empty or past the limits", r, c);
    size_t n = (size_t)r * c;
    if (len != DISTILL_HEAD + 4 * n)
        return edl_errf(err, errlen, EDL_EPROTO, "binary tensor: %u x %u needs %zu bytes, got %zu",
                        r, c, DISTILL_HEAD + 4 * n, len);
    float *v = malloc(4 * n);
    if (!v)
        return EDL_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = get_u32(b + DISTILL_HEAD + 4 * i);
        memcpy(&v[i], &u, 4);
        if (!isfinite(v[i])) {
            free(v);
            return edl_errf(err, errlen, EDL_EPROTO, "binary tensor: value %zu is not finite "
                            "(NaN or infinity), which the JSON form cannot carry either", i);
        }
    }
    *x = v, *rows = r, *cols = c;
    return 0;
}

/* ---- JSON: the writer --------------------------------------------------------------------- */

static int encode_json(bool reply, const float *x, uint32_t rows, uint32_t cols, char **body,
                       size_t *len)
{
    /* "%.9g" gives back the same float when read; 16 characters hold the longest ("-1.23456789e-38") */
    size_t cap = 32 + (size_t)rows * (3 + (size_t)cols * 17), n = 0;
    char *b = malloc(cap);
    if (!b)
        return EDL_ENOMEM;
    n += (size_t)sprintf(b, "{\"%s\":[", distill_json_key(reply));
    for (uint32_t r = 0; r < rows; r++) {
        b[n++] = r ? ',' : '[';
        if (r)
            b[n++] = '[';
        for (uint32_t c = 0; c < cols; c++) {
            float v = x[(size_t)r * cols + c];
            if (!isfinite(v)) {
                free(b);
                return EDL_EINVAL;
            }
            n += (size_t)snprintf(b + n, cap - n, c ? ",%.9g" : "%.9g", (double)v);
        }
        b[n++] = ']';
    }
    n += (size_t)snprintf(b + n, cap - n, "]}");
    *body = b, *len = n;
    return 0;
}

/* ---- JSON: the reader --------------------------------------------------------------------- */

typedef struct jreader {
    const char *p, *end;
    float *x;            /* NULL in the counting pass */
    uint32_t rows, cols; /* counted (pass 1), expected (pass 2) */
    bool flat;           /* rows are bare numbers: a tensor of one column */
    char *err;
    size_t errlen;
} jreader;

static int jfail(jreader *j, int rc, const char *what)
{
    return edl_errf(j->err, j->errlen, rc, "JSON tensor: %s", what);
}

static void jws(jreader *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static bool jeat(jreader *j, char c)
{
    jws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return true;
    }
    return false;
}

static size_t digits(const char *p, const char *end)
{
    size_t n = 0;
    while (p + n < end && p[n] >= '0' && p[n] <= '9')
        n++;
    return n;
}

/* One JSON number (RFC 8259's grammar, at most DISTILL_NUMBER_MAX characters) that fits a float. */
static int jnumber(jreader *j, float *out)
{
    jws(j);
    const char *s = j->p, *q = s;
    if (q < j->end && *q == '-')
        q++;
    size_t d = digits(q, j->end);
    if (d == 0 || (d > 1 && *q == '0'))
        return jfail(j, EDL_EPROTO, "expected a number");
    q += d;
    if (q < j->end && *q == '.') {
        if (!(d = digits(++q, j->end)))
            return jfail(j, EDL_EPROTO, "a number's fraction has no digits");
        q += d;
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < j->end && (*q == '+' || *q == '-'))
            q++;
        if (!(d = digits(q, j->end)))
            return jfail(j, EDL_EPROTO, "a number's exponent has no digits");
        q += d;
    }
    if ((size_t)(q - s) >= DISTILL_NUMBER_MAX)
        return jfail(j, EDL_EPROTO, "a number longer than 63 characters");
    char buf[DISTILL_NUMBER_MAX];
    memcpy(buf, s, (size_t)(q - s));
    buf[q - s] = '\0';
    float v = strtof(buf, NULL);
    if (!isfinite(v))
        return jfail(j, EDL_EPROTO, "a number out of float's range");
    *out = v;
    j->p = q;
    return 0;
}

/* One row: [n, ...] or, in a flat tensor, a bare number. Counts its columns into *cols. */
static int jrow(jreader *j, uint32_t row, uint32_t *cols)
{
    float v;
    int rc;
    if (j->flat) {
        if ((rc = jnumber(j, &v)))
            return rc;
        if (j->x)
            j->x[row] = v;
        *cols = 1;
        return 0;
    }
    if (!jeat(j, '['))
        return jfail(j, EDL_EPROTO, "expected a row ('[')");
    uint32_t c = 0;
    do {
        if (c == EDL_DISTILL_MAX_COLS)
            return jfail(j, EDL_ETOOBIG, "a row has more columns than EDL_DISTILL_MAX_COLS");
        if ((rc = jnumber(j, &v)))
            return rc;
        if (j->x && c < j->cols)
            j->x[(size_t)row * j->cols + c] = v;
        c++;
    } while (jeat(j, ','));
    if (!jeat(j, ']'))
        return jfail(j, EDL_EPROTO, "expected ',' or ']' in a row");
    *cols = c;
    return 0;
}

/* The tensor: [row, ...], every row as wide as the first. */
static int jtensor(jreader *j)
{
    if (!jeat(j, '['))
        return jfail(j, EDL_EPROTO, "the tensor is not an array");
    jws(j);
    j->flat = j->p < j->end && *j->p != '[';
    uint32_t r = 0, first = 0, c = 0;
    int rc;
    do {
        if (r == EDL_DISTILL_MAX_ROWS)
            return jfail(j, EDL_ETOOBIG, "more rows than EDL_DISTILL_MAX_ROWS");
        if ((rc = jrow(j, r, &c)))
            return rc;
        if (r == 0)
            first = c;
        else if (c != first)
            return jfail(j, EDL_EPROTO, "rows of different lengths");
        r++;
    } while (jeat(j, ','));
    if (!jeat(j, ']'))
        return jfail(j, EDL_EPROTO, "expected ',' or ']' after a row");
    if (j->x && (r != j->rows || first != j->cols))
        return jfail(j, EDL_EPROTO, "changed between passes"); /* cannot happen */
    j->rows = r, j->cols = first;
    return 0;
}

/* A string without escapes or control characters (the keys and signature_name we take). */
static int jstring(jreader *j, const char **s, size_t *n)
{
    if (!jeat(j, '"'))
        return jfail(j, EDL_EPROTO, "expected a string");
    const char *b = j->p;
    while (j->p < j->end && *j->p != '"') {
        if (*j->p == '\\' || (unsigned char)*j->p < 0x20)
            return jfail(j, EDL_EPROTO, "escapes and control characters are not taken in strings");
        j->p++;
    }
    if (j->p == j->end)
        return jfail(j, EDL_EPROTO, "an unterminated string");
    *s = b, *n = (size_t)(j->p++ - b);
    return 0;
}

static bool key_is(const char *k, size_t n, const char *want)
{
    return n == strlen(want) && memcmp(k, want, n) == 0;
}

/* The document: {"<key>": tensor} (a request may also carry "signature_name": "..."). */
static int jdocument(jreader *j, bool reply)
{
    const char *k;
    size_t n;
    bool seen = false, sig = false;
    int rc;
    if (!jeat(j, '{'))
        return jfail(j, EDL_EPROTO, "not a JSON object");
    do {
        if ((rc = jstring(j, &k, &n)))
            return rc;
        if (!jeat(j, ':'))
            return jfail(j, EDL_EPROTO, "expected ':' after a key");
        if (key_is(k, n, distill_json_key(reply)) && !seen) {
            seen = true;
            if ((rc = jtensor(j)))
                return rc;
        } else if (!reply && key_is(k, n, "signature_name") && !sig) {
            sig = true;
            if ((rc = jstring(j, &k, &n)))
                return rc;
        } else
            return jfail(j, EDL_EPROTO, reply ? "a reply holds \"predictions\" and nothing else"
                         : "a request holds \"instances\" (and \"signature_name\") only");
    } while (jeat(j, ','));
    if (!jeat(j, '}'))
        return jfail(j, EDL_EPROTO, "expected ',' or '}' in the object");
    jws(j);
    if (j->p != j->end)
        return jfail(j, EDL_EPROTO, "bytes after the JSON object");
    if (!seen)
        return jfail(j, EDL_EPROTO, reply ? "no \"predictions\"" : "no \"instances\"");
    return 0;
}

static int decode_json(bool reply, const char *body, size_t len, float **x, uint32_t *rows,
                       uint32_t *cols, char *err, size_t errlen)
{
    jreader j = {body, body + len, NULL, 0, 0, false, err, errlen};
    int rc = jdocument(&j, reply);
    if (rc)
        return rc;
    if (!(j.x = malloc((size_t)j.rows * j.cols * sizeof *j.x)))
        return EDL_ENOMEM;
    j.p = body;
    if ((rc = jdocument(&j, reply))) {
        free(j.x);
        return rc;
    }
    *x = j.x, *rows = j.rows, *cols = j.cols;
    return 0;
}

/* ---- the public calls --------------------------------------------------------------------- */

int edl_distill_encode(edl_distill_format f, bool reply, const float *x, uint32_t rows,
                       uint32_t cols, char **body, size_t *len)
{
    if (!x || !body || !len || !shape_ok(rows, cols))
        return EDL_EINVAL;
    if (f == EDL_DISTILL_BINARY)
        return encode_binary(x, rows, cols, body, len);
    if ((uint64_t)rows * (3 + (uint64_t)cols * 17) > EDL_DISTILL_MAX_BODY)
        return EDL_EINVAL;
    return encode_json(reply, x, rows, cols, body, len);
}

int edl_distill_decode(edl_distill_format f, bool reply, const char *body, size_t len,
                       float **x, uint32_t *rows, uint32_t *cols, char *err, size_t errlen)
{
    if (!body || !x || !rows || !cols)
        return EDL_EINVAL;
    if (len > EDL_DISTILL_MAX_BODY)
        return edl_errf(err, errlen, EDL_ETOOBIG, "tensor: %zu bytes, over EDL_DISTILL_MAX_BODY",
                        len);
    if (f == EDL_DISTILL_BINARY)
        return decode_binary((const uint8_t *)body, len, x, rows, cols, err, errlen);
    return decode_json(reply, body, len, x, rows, cols, err, errlen);
}
