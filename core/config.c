/* config.c: decode one YAML document into a caller's struct, driven by an edl_cfg_field table.
 *
 * The YAML is read as a stream of libyaml events and checked against the schema as it goes,
 * so input the schema does not describe is refused before anything below it is looked at.
 * Decoded values are staged in a list and copied into the caller's struct only once the whole
 * document (and the required-field check) has passed: on any error the struct is untouched.
 * Aliases are refused and size and depth are capped, so what hostile input can cost in time
 * and memory grows only with its (capped) size. */
#include "edl/config.h"

#include "edl/common.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define PATH_CAP 256
#define QUOTE_MAX 40 /* bytes of a bad value shown in a message */

/* A NULL-terminated list of strings being built; cap counts the terminator's slot too. */
typedef struct strlist {
    char **items;
    size_t n, cap;
} strlist;

/* A decoded value waiting to be stored. base is the offset of the enclosing (sub)struct in the
 * caller's struct; parent is the staged OBJECT that holds it (-1 at the top), which keeps two
 * appearances of one table apart and lets the required check see which objects appeared. */
typedef struct staged {
    const edl_cfg_field *field;
    size_t base;
    long parent;
    size_t line;
    union {
        int64_t i;
        double d;
        bool b;
        char *s;
        strlist list;
    } v;
} staged;

typedef struct decoder {
    yaml_parser_t parser;
    const char *source;
    char *err;
    size_t errlen;
    staged *st;
    size_t nst, capst;
    int depth;
    char path[PATH_CAP]; /* dotted path of the field being decoded, for messages */
    size_t pathlen;
} decoder;

/* ---- messages ---- */

__attribute__((format(printf, 4, 0))) static size_t vappend(char *buf, size_t cap, size_t n, const char *fmt,
                                                             va_list ap)
{
    if (!buf || n + 1 >= cap) return n;
    int r = vsnprintf(buf + n, cap - n, fmt, ap);
    if (r < 0) return n;
    return (size_t)r < cap - n ? n + (size_t)r : cap - 1;
}

__attribute__((format(printf, 4, 5))) static size_t append(char *buf, size_t cap, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    n = vappend(buf, cap, n, fmt, ap);
    va_end(ap);
    return n;
}

/* Every message starts with the source; line and column follow when there is a position
 * (line 0 = none, column 0 = line only), then "field 'a.b': " when field is set. */
__attribute__((format(printf, 6, 7))) static int fail(decoder *d, int code, size_t line, size_t col, bool field,
                                                      const char *fmt, ...)
{
    if (!d->err || d->errlen == 0) return code;
    size_t n = append(d->err, d->errlen, 0, "%s", d->source);
    if (line) n = append(d->err, d->errlen, n, ":%zu", line);
    if (line && col) n = append(d->err, d->errlen, n, ":%zu", col);
    n = append(d->err, d->errlen, n, ": ");
    if (field) n = append(d->err, d->errlen, n, "field '%s': ", d->path);
    va_list ap;
    va_start(ap, fmt);
    vappend(d->err, d->errlen, n, fmt, ap);
    va_end(ap);
    return code;
}

#define LINE(m) ((m).line + 1)
#define COL(m) ((m).column + 1)
#define fail_value(d, mark, ...) fail((d), EDL_ECONFIG, LINE(mark), COL(mark), true, __VA_ARGS__)
#define fail_at(d, mark, ...) fail((d), EDL_ECONFIG, LINE(mark), COL(mark), false, __VA_ARGS__)
#define fail_nomem(d) fail((d), EDL_ENOMEM, 0, 0, false, "out of memory while loading the configuration")

/* A value as it may appear in a message: quoted, control bytes escaped, long ones cut. */
static const char *quote(const char *s, size_t len, char *buf, size_t cap)
{
    size_t n = append(buf, cap, 0, "\"");
    size_t shown = len;
    if (shown > QUOTE_MAX) {
        shown = QUOTE_MAX;
        while (shown > 0 && ((unsigned char)s[shown] & 0xc0) == 0x80) shown--; /* whole UTF-8 chars */
    }
    for (size_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') n = append(buf, cap, n, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) n = append(buf, cap, n, "\\x%02x", c);
        else n = append(buf, cap, n, "%c", c);
    }
    if (shown < len) append(buf, cap, n, "...\" (%zu bytes)", len);
    else append(buf, cap, n, "\"");
    return buf;
}

static bool is_null(const yaml_event_t *ev)
{
    if (ev->type != YAML_SCALAR_EVENT || ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    if (ev->data.scalar.tag && strcmp((const char *)ev->data.scalar.tag, YAML_STR_TAG) == 0) return false;
    const char *v = (const char *)ev->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

static const char *describe(const yaml_event_t *ev, char *buf, size_t cap)
{
    switch (ev->type) {
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_SCALAR_EVENT:
        if (is_null(ev)) return "nothing (null)";
        return quote((const char *)ev->data.scalar.value, ev->data.scalar.length, buf, cap);
    default: return "an unexpected YAML event";
    }
}

/* ---- the dotted field path ---- */

/* Append ".name" (or "name" at the top); returns the length to restore. Bytes that would not
 * print are shown as '?': the name may come from the file. */
static size_t push_name(decoder *d, const char *name, size_t len)
{
    size_t old = d->pathlen, n = old;
    if (n && n + 1 < PATH_CAP) d->path[n++] = '.';
    for (size_t i = 0; i < len && n + 1 < PATH_CAP; i++)
        d->path[n++] = isprint((unsigned char)name[i]) ? name[i] : '?';
    d->path[n] = '\0';
    d->pathlen = n;
    return old;
}

static size_t push_index(decoder *d, size_t i)
{
    size_t old = d->pathlen;
    d->pathlen = append(d->path, PATH_CAP, old, "[%zu]", i);
    return old;
}

static void pop_path(decoder *d, size_t old)
{
    d->pathlen = old;
    d->path[old] = '\0';
}

/* ---- events ---- */

static int syntax_error(decoder *d)
{
    yaml_parser_t *p = &d->parser;
    const char *problem = p->problem ? p->problem : "unknown error";

    if (p->error == YAML_MEMORY_ERROR) return fail_nomem(d);
    if (p->error == YAML_READER_ERROR)
        return fail(d, EDL_ECONFIG, 0, 0, false, "not readable as YAML text at byte %zu: %s", p->problem_offset,
                    problem);
    if (p->context)
        return fail(d, EDL_ECONFIG, LINE(p->problem_mark), COL(p->problem_mark), false,
                    "YAML syntax error: %s (%s on line %zu)", problem, p->context, LINE(p->context_mark));
    return fail(d, EDL_ECONFIG, LINE(p->problem_mark), COL(p->problem_mark), false, "YAML syntax error: %s", problem);
}

/* The next event; aliases never get past here, so no document can expand beyond its size. */
static int next_event(decoder *d, yaml_event_t *ev)
{
    if (!yaml_parser_parse(&d->parser, ev)) return syntax_error(d);
    if (ev->type != YAML_ALIAS_EVENT) return 0;
    int rc = fail_at(d, ev->start_mark, "YAML aliases (*%s) are not allowed in edl configuration; write the value out",
                     (const char *)ev->data.alias.anchor);
    yaml_event_delete(ev);
    return rc;
}

static int enter(decoder *d, const yaml_event_t *ev)
{
    if (++d->depth <= EDL_CONFIG_MAX_DEPTH) return 0;
    return fail_at(d, ev->start_mark, "nested deeper than %d levels", EDL_CONFIG_MAX_DEPTH);
}

/* ---- staging ---- */

static long find_staged(const decoder *d, const edl_cfg_field *f, size_t base, long parent)
{
    for (size_t i = 0; i < d->nst; i++)
        if (d->st[i].field == f && d->st[i].base == base && d->st[i].parent == parent) return (long)i;
    return -1;
}

static int stage(decoder *d, const edl_cfg_field *f, size_t base, long parent, size_t line, long *idx)
{
    if (d->nst == d->capst) {
        size_t cap = d->capst ? d->capst * 2 : 16;
        staged *st = realloc(d->st, cap * sizeof *st);
        if (!st) return fail_nomem(d);
        d->st = st;
        d->capst = cap;
    }
    d->st[d->nst] = (staged){.field = f, .base = base, .parent = parent, .line = line};
    *idx = (long)d->nst++;
    return 0;
}

static void free_list(char **items, size_t n)
{
    if (!items) return;
    for (size_t i = 0; i < n; i++) free(items[i]);
    free(items);
}

static void free_staged(decoder *d)
{
    for (size_t i = 0; i < d->nst; i++) {
        if (d->st[i].field->type == EDL_CFG_STRING) free(d->st[i].v.s);
        if (d->st[i].field->type == EDL_CFG_STRING_LIST) free_list(d->st[i].v.list.items, d->st[i].v.list.n);
    }
    free(d->st);
    d->st = NULL;
    d->nst = d->capst = 0;
}

/* ---- scalars ---- */

static int digit_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return 99;
}

enum { PARSE_OK = 0, PARSE_SYNTAX = -1, PARSE_RANGE = -2, PARSE_NEGATIVE = -3, PARSE_PRECISION = -4 };

/* 42, -7, +3, 0x1F: the whole text, no spaces, no silent wrap-around. */
static int parse_int64(const char *s, size_t len, int64_t *out)
{
    size_t i = 0;
    unsigned base = 10;
    bool neg = false;
    uint64_t mag = 0;

    if (i < len && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (len - i > 2 && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
        base = 16;
        i += 2;
    }
    if (i == len) return PARSE_SYNTAX;
    for (; i < len; i++) {
        unsigned dv = (unsigned)digit_value(s[i]);
        if (dv >= base) return PARSE_SYNTAX;
        if (mag > (UINT64_MAX - dv) / base) return PARSE_RANGE;
        mag = mag * base + dv;
    }
    if (mag > (uint64_t)INT64_MAX + neg) return PARSE_RANGE;
    *out = neg ? (mag > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    return PARSE_OK;
}

static int64_t unit_ms(const char *u, size_t len)
{
    if (len == 2 && !memcmp(u, "ms", 2)) return 1;
    if (len == 1 && *u == 's') return 1000;
    if (len == 1 && *u == 'm') return 60 * 1000;
    if (len == 1 && *u == 'h') return 3600 * 1000;
    return -1;
}

/* One "<number>[.<fraction>]<unit>" part of a duration; advances *pos. */
static int parse_duration_part(const char *s, size_t len, size_t *pos, int64_t *ms)
{
    size_t i = *pos, digits = 0;
    uint64_t whole = 0, frac = 0, scale = 1;

    for (; i < len && isdigit((unsigned char)s[i]); i++, digits++) {
        if (whole > (UINT64_MAX - 9) / 10) return PARSE_RANGE;
        whole = whole * 10 + (uint64_t)(s[i] - '0');
    }
    if (i < len && s[i] == '.') {
        for (i++; i < len && isdigit((unsigned char)s[i]); i++, digits++) {
            if (scale < 1000000000) {
                frac = frac * 10 + (uint64_t)(s[i] - '0');
                scale *= 10;
            } else if (s[i] != '0') {
                return PARSE_PRECISION;
            }
        }
    }
    size_t u = i;
    while (i < len && isalpha((unsigned char)s[i])) i++;
    int64_t unit = unit_ms(s + u, i - u);
    if (!digits || unit < 0) return PARSE_SYNTAX;
    if (frac * (uint64_t)unit % scale) return PARSE_PRECISION;
    if (whole > (uint64_t)INT64_MAX) return PARSE_RANGE;
    int64_t v;
    if (__builtin_mul_overflow((int64_t)whole, unit, &v) || __builtin_add_overflow(v, (int64_t)(frac * (uint64_t)unit / scale), &v))
        return PARSE_RANGE;
    *ms = v;
    *pos = i;
    return PARSE_OK;
}

/* 1500 (bare = milliseconds), 500ms, 1.5s, 2m, 1h, 1h30m. */
static int parse_duration_ms(const char *s, size_t len, int64_t *out)
{
    int64_t total = 0;
    int rc = parse_int64(s, len, &total);
    if (rc != PARSE_SYNTAX) {
        if (rc == PARSE_OK && total < 0) return PARSE_NEGATIVE;
        if (rc == PARSE_OK) *out = total;
        return rc;
    }
    if (len && s[0] == '-') return PARSE_NEGATIVE;
    total = 0;
    for (size_t i = 0; i < len;) {
        int64_t part;
        if ((rc = parse_duration_part(s, len, &i, &part)) != PARSE_OK) return rc;
        if (__builtin_add_overflow(total, part, &total)) return PARSE_RANGE;
    }
    if (!len) return PARSE_SYNTAX;
    *out = total;
    return PARSE_OK;
}

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        if (!strcmp(s, yes[i]) || !strcmp(s, no[i])) {
            *out = !strcmp(s, yes[i]);
            return PARSE_OK;
        }
    }
    return PARSE_SYNTAX;
}

static int check_range(decoder *d, const edl_cfg_field *f, const yaml_event_t *ev, int64_t v, const char *unit)
{
    if ((f->min == 0 && f->max == 0) || (v >= f->min && v <= f->max)) return 0;
    return fail_value(d, ev->start_mark, "%" PRId64 "%s is out of range (min %" PRId64 "%s, max %" PRId64 "%s)", v,
                      unit, f->min, unit, f->max, unit);
}

/* libyaml NUL-terminates scalar values; a NUL inside one would silently cut a C string. */
static int scalar_text(decoder *d, const yaml_event_t *ev, const char *want, const char **s, size_t *len)
{
    char buf[QUOTE_MAX * 4 + 32];
    if (ev->type != YAML_SCALAR_EVENT || is_null(ev))
        return fail_value(d, ev->start_mark, "expected %s, got %s", want, describe(ev, buf, sizeof buf));
    *s = (const char *)ev->data.scalar.value;
    *len = ev->data.scalar.length;
    if (memchr(*s, '\0', *len)) return fail_value(d, ev->start_mark, "expected %s, got text with a NUL byte", want);
    return 0;
}

static int decode_string(decoder *d, const yaml_event_t *ev, char **out)
{
    const char *s;
    size_t len;
    int rc = scalar_text(d, ev, "a string", &s, &len);
    if (rc) return rc;
    if (!(*out = strdup(s))) return fail_nomem(d);
    return 0;
}

static int decode_int(decoder *d, const edl_cfg_field *f, const yaml_event_t *ev, int64_t *out)
{
    char buf[QUOTE_MAX * 4 + 32];
    const char *s;
    size_t len;
    int rc = scalar_text(d, ev, "an integer", &s, &len);
    if (rc) return rc;
    rc = parse_int64(s, len, out);
    if (rc == PARSE_RANGE)
        return fail_value(d, ev->start_mark, "%s does not fit in a 64-bit integer", quote(s, len, buf, sizeof buf));
    if (rc) return fail_value(d, ev->start_mark, "expected an integer, got %s", quote(s, len, buf, sizeof buf));
    return check_range(d, f, ev, *out, "");
}

static int decode_duration(decoder *d, const edl_cfg_field *f, const yaml_event_t *ev, int64_t *out)
{
    char buf[QUOTE_MAX * 4 + 32];
    const char *s;
    size_t len;
    int rc = scalar_text(d, ev, "a duration (e.g. 500ms, 2s)", &s, &len);
    if (rc) return rc;
    rc = parse_duration_ms(s, len, out);
    quote(s, len, buf, sizeof buf);
    switch (rc) {
    case PARSE_OK: return check_range(d, f, ev, *out, "ms");
    case PARSE_RANGE: return fail_value(d, ev->start_mark, "duration %s is too long", buf);
    case PARSE_NEGATIVE: return fail_value(d, ev->start_mark, "duration %s is negative", buf);
    case PARSE_PRECISION:
        return fail_value(d, ev->start_mark, "duration %s is finer than a millisecond, the smallest unit", buf);
    default:
        return fail_value(d, ev->start_mark, "expected a duration (e.g. 500ms, 2s), got %s; units are ms, s, m, h",
                          buf);
    }
}

static int decode_bool(decoder *d, const yaml_event_t *ev, bool *out)
{
    char buf[QUOTE_MAX * 4 + 32];
    const char *s;
    size_t len;
    int rc = scalar_text(d, ev, "true or false", &s, &len);
    if (rc) return rc;
    if (parse_bool(s, out))
        return fail_value(d, ev->start_mark, "expected true or false (or yes/no, on/off), got %s",
                          quote(s, len, buf, sizeof buf));
    return 0;
}

static int decode_double(decoder *d, const yaml_event_t *ev, double *out)
{
    char buf[QUOTE_MAX * 4 + 32];
    const char *s;
    size_t len;
    char *end;
    int rc = scalar_text(d, ev, "a number", &s, &len);
    if (rc) return rc;
    *out = strtod(s, &end);
    if (len == 0 || isspace((unsigned char)s[0]) || end != s + len || !isfinite(*out))
        return fail_value(d, ev->start_mark, "expected a finite number, got %s", quote(s, len, buf, sizeof buf));
    return 0;
}

/* ---- collections ---- */

static int decode_mapping(decoder *d, const edl_cfg_field *table, size_t base, long parent);

static int decode_object(decoder *d, const edl_cfg_field *f, size_t base, long idx, const yaml_event_t *ev)
{
    char buf[QUOTE_MAX * 4 + 32];
    if (is_null(ev)) return 0; /* "tls:" with every line below commented out: all defaults */
    if (ev->type != YAML_MAPPING_START_EVENT)
        return fail_value(d, ev->start_mark, "expected a mapping of fields, got %s", describe(ev, buf, sizeof buf));
    int rc = enter(d, ev);
    if (!rc) rc = decode_mapping(d, f->fields, base + f->offset, idx);
    d->depth--;
    return rc;
}

static int list_add(decoder *d, const yaml_event_t *ev, strlist *l)
{
    if (l->n + 2 > l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        char **grown = realloc(l->items, cap * sizeof *grown);
        if (!grown) return fail_nomem(d);
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n] = NULL;
    int rc = decode_string(d, ev, &l->items[l->n]);
    if (rc) return rc;
    l->items[++l->n] = NULL;
    return 0;
}

static int decode_sequence(decoder *d, strlist *l)
{
    for (;;) {
        yaml_event_t ev;
        int rc = next_event(d, &ev);
        if (rc) return rc;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            return 0;
        }
        size_t old = push_index(d, l->n);
        rc = list_add(d, &ev, l);
        pop_path(d, old);
        yaml_event_delete(&ev);
        if (rc) return rc;
    }
}

/* A list of strings; one scalar is a list of one. */
static int decode_list(decoder *d, long idx, const yaml_event_t *ev)
{
    char buf[QUOTE_MAX * 4 + 32];
    strlist l = {0};
    int rc;

    if (ev->type == YAML_SCALAR_EVENT && !is_null(ev)) {
        rc = list_add(d, ev, &l);
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        rc = enter(d, ev);
        if (!rc) rc = decode_sequence(d, &l);
        d->depth--;
    } else {
        rc = fail_value(d, ev->start_mark, "expected a list of strings, got %s", describe(ev, buf, sizeof buf));
    }
    if (rc) {
        free_list(l.items, l.n);
        return rc;
    }
    d->st[idx].v.list = l;
    return 0;
}

/* Decode the value of field f (whose struct starts at base) into a new staged entry;
 * key_line is remembered for a later duplicate. */
static int decode_value(decoder *d, const edl_cfg_field *f, size_t base, long parent, size_t key_line)
{
    yaml_event_t ev;
    long idx = -1;
    int rc = next_event(d, &ev);
    if (rc) return rc;
    rc = stage(d, f, base, parent, key_line, &idx);
    if (!rc) {
        staged *s = &d->st[idx];
        switch (f->type) {
        case EDL_CFG_STRING: rc = decode_string(d, &ev, &s->v.s); break;
        case EDL_CFG_INT: rc = decode_int(d, f, &ev, &s->v.i); break;
        case EDL_CFG_BOOL: rc = decode_bool(d, &ev, &s->v.b); break;
        case EDL_CFG_DOUBLE: rc = decode_double(d, &ev, &s->v.d); break;
        case EDL_CFG_DURATION_MS: rc = decode_duration(d, f, &ev, &s->v.i); break;
        case EDL_CFG_STRING_LIST: rc = decode_list(d, idx, &ev); break; /* may move d->st */
        case EDL_CFG_OBJECT: rc = decode_object(d, f, base, idx, &ev); break;
        }
    }
    yaml_event_delete(&ev);
    return rc;
}

static const edl_cfg_field *find_field(const edl_cfg_field *table, const char *name, size_t len)
{
    for (; table && table->name; table++)
        if (strlen(table->name) == len && !memcmp(table->name, name, len)) return table;
    return NULL;
}

static int unknown_field(decoder *d, const edl_cfg_field *table, const yaml_event_t *key)
{
    char known[512];
    size_t n = 0;
    for (const edl_cfg_field *f = table; f && f->name; f++)
        n = append(known, sizeof known, n, "%s%s", f == table ? "" : ", ", f->name);
    if (n == 0) append(known, sizeof known, 0, "none");
    return fail(d, EDL_ECONFIG, LINE(key->start_mark), 0, false, "unknown field '%s' (known fields: %s)", d->path,
                known);
}

static int decode_entry(decoder *d, const edl_cfg_field *table, size_t base, long parent, const yaml_event_t *key)
{
    char buf[QUOTE_MAX * 4 + 32];
    if (key->type != YAML_SCALAR_EVENT || is_null(key))
        return fail_at(d, key->start_mark, "expected a field name, got %s", describe(key, buf, sizeof buf));

    const char *name = (const char *)key->data.scalar.value;
    size_t len = key->data.scalar.length;
    const edl_cfg_field *f = find_field(table, name, len);
    size_t old = push_name(d, name, len);
    long prev = f ? find_staged(d, f, base, parent) : -1;
    int rc;
    if (!f) rc = unknown_field(d, table, key);
    else if (prev >= 0)
        rc = fail_at(d, key->start_mark, "duplicate field '%s' (first set on line %zu)", d->path, d->st[prev].line);
    else rc = decode_value(d, f, base, parent, LINE(key->start_mark));
    pop_path(d, old);
    return rc;
}

static int decode_mapping(decoder *d, const edl_cfg_field *table, size_t base, long parent)
{
    for (;;) {
        yaml_event_t key;
        int rc = next_event(d, &key);
        if (rc) return rc;
        if (key.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&key);
            return 0;
        }
        rc = decode_entry(d, table, base, parent, &key);
        yaml_event_delete(&key);
        if (rc) return rc;
    }
}

/* ---- document ---- */

/* Read an event and drop it, keeping its type and position: the stream and document frame. */
static int skip_event(decoder *d, yaml_event_type_t *type, yaml_mark_t *mark)
{
    yaml_event_t ev;
    int rc = next_event(d, &ev);
    if (rc) return rc;
    *type = ev.type;
    *mark = ev.start_mark;
    yaml_event_delete(&ev);
    return 0;
}

static int decode_root(decoder *d, const edl_cfg_field *schema)
{
    char buf[QUOTE_MAX * 4 + 32];
    yaml_event_t ev;
    int rc = next_event(d, &ev);
    if (rc) return rc;
    if (ev.type == YAML_MAPPING_START_EVENT) {
        rc = enter(d, &ev);
        if (!rc) rc = decode_mapping(d, schema, 0, -1);
        d->depth--;
    } else if (!is_null(&ev)) {
        rc = fail_at(d, ev.start_mark, "the top level must be a mapping of field names, got %s",
                     describe(&ev, buf, sizeof buf));
    }
    yaml_event_delete(&ev);
    return rc;
}

static int decode_document(decoder *d, const edl_cfg_field *schema)
{
    yaml_event_type_t type;
    yaml_mark_t mark;
    int rc = skip_event(d, &type, &mark); /* stream start */
    if (!rc) rc = skip_event(d, &type, &mark);
    if (rc || type == YAML_STREAM_END_EVENT) return rc; /* no document at all: all defaults */
    rc = decode_root(d, schema);
    if (!rc) rc = skip_event(d, &type, &mark); /* document end */
    if (!rc) rc = skip_event(d, &type, &mark);
    if (!rc && type != YAML_STREAM_END_EVENT)
        rc = fail_at(d, mark, "a second YAML document; a configuration file holds exactly one");
    return rc;
}

static int check_required(decoder *d, const edl_cfg_field *table, size_t base, long parent)
{
    for (const edl_cfg_field *f = table; f && f->name; f++) {
        long idx = find_staged(d, f, base, parent);
        size_t old = push_name(d, f->name, strlen(f->name));
        int rc = 0;
        if (f->required && idx < 0) rc = fail(d, EDL_ECONFIG, 0, 0, false, "missing required field '%s'", d->path);
        else if (f->type == EDL_CFG_OBJECT && idx >= 0) rc = check_required(d, f->fields, base + f->offset, idx);
        pop_path(d, old);
        if (rc) return rc;
    }
    return 0;
}

/* Move every staged value into the struct; cannot fail, so the struct never ends half-done. */
static void commit(decoder *d, char *out)
{
    for (size_t i = 0; i < d->nst; i++) {
        staged *s = &d->st[i];
        char *p = out + s->base + s->field->offset;
        switch (s->field->type) {
        case EDL_CFG_STRING:
            free(*(char **)p);
            *(char **)p = s->v.s;
            s->v.s = NULL;
            break;
        case EDL_CFG_INT:
        case EDL_CFG_DURATION_MS: *(int64_t *)p = s->v.i; break;
        case EDL_CFG_BOOL: *(bool *)p = s->v.b; break;
        case EDL_CFG_DOUBLE: *(double *)p = s->v.d; break;
        case EDL_CFG_STRING_LIST: {
            size_t *count = (size_t *)(out + s->base + s->field->count_offset);
            free_list(*(char ***)p, *count);
            *(char ***)p = s->v.list.items;
            *count = s->v.list.n;
            s->v.list.items = NULL;
            break;
        }
        case EDL_CFG_OBJECT: break;
        }
    }
}

int edl_config_load_string(const char *text, size_t len, const char *source_name, const edl_cfg_field *schema,
                           void *out, char *err, size_t errlen)
{
    decoder d = {.source = source_name ? source_name : "<string>", .err = err, .errlen = errlen};

    if (err && errlen) err[0] = '\0';
    if ((!text && len) || !schema || !out) return fail(&d, EDL_EINVAL, 0, 0, false, "invalid arguments");
    if (len > EDL_CONFIG_MAX_BYTES)
        return fail(&d, EDL_ETOOBIG, 0, 0, false, "%zu bytes is more than the %u-byte limit for a configuration", len,
                    EDL_CONFIG_MAX_BYTES);
    if (!yaml_parser_initialize(&d.parser)) return fail_nomem(&d);
    yaml_parser_set_input_string(&d.parser, (const unsigned char *)(text ? text : ""), len);

    int rc = decode_document(&d, schema);
    if (!rc) rc = check_required(&d, schema, 0, -1);
    if (!rc) commit(&d, out);
    free_staged(&d);
    yaml_parser_delete(&d.parser);
    return rc;
}

/* The whole file, reading at most one byte past the size cap (the file may be a pipe). */
static int read_capped(decoder *d, FILE *fp, char **text, size_t *len)
{
    size_t cap = 64 * 1024, n = 0;
    char *buf = malloc(cap);
    if (!buf) return fail_nomem(d);
    for (;;) {
        n += fread(buf + n, 1, cap - n, fp);
        if (n < cap) break;
        if (n > EDL_CONFIG_MAX_BYTES) {
            free(buf);
            return fail(d, EDL_ETOOBIG, 0, 0, false, "larger than the %u-byte limit for a configuration file",
                        EDL_CONFIG_MAX_BYTES);
        }
        size_t next = cap * 2 > EDL_CONFIG_MAX_BYTES + 1 ? EDL_CONFIG_MAX_BYTES + 1 : cap * 2;
        char *grown = realloc(buf, next);
        if (!grown) {
            free(buf);
            return fail_nomem(d);
        }
        buf = grown;
        cap = next;
    }
    if (ferror(fp)) {
        int e = errno;
        free(buf);
        return fail(d, EDL_EIO, 0, 0, false, "cannot read: %s", strerror(e));
    }
    *text = buf;
    *len = n;
    return 0;
}

int edl_config_load_file(const char *path, const edl_cfg_field *schema, void *out, char *err, size_t errlen)
{
    decoder d = {.source = path ? path : "<null>", .err = err, .errlen = errlen};
    char *text = NULL;
    size_t len = 0;

    if (err && errlen) err[0] = '\0';
    if (!path || !schema || !out) return fail(&d, EDL_EINVAL, 0, 0, false, "invalid arguments");
    FILE *fp = fopen(path, "re");
    if (!fp) return fail(&d, EDL_EIO, 0, 0, false, "cannot open: %s", strerror(errno));
    int rc = read_capped(&d, fp, &text, &len);
    fclose(fp);
    if (rc) return rc;
    rc = edl_config_load_string(text, len, path, schema, out, err, errlen);
    free(text);
    return rc;
}

static void free_table(const edl_cfg_field *table, char *base, int depth)
{
    if (depth > EDL_CONFIG_MAX_DEPTH) return;
    for (const edl_cfg_field *f = table; f && f->name; f++) {
        char *p = base + f->offset;
        if (f->type == EDL_CFG_STRING) {
            free(*(char **)p);
            *(char **)p = NULL;
        } else if (f->type == EDL_CFG_STRING_LIST) {
            size_t *count = (size_t *)(base + f->count_offset);
            free_list(*(char ***)p, *count);
            *(char ***)p = NULL;
            *count = 0;
        } else if (f->type == EDL_CFG_OBJECT) {
            free_table(f->fields, p, depth + 1);
        }
    }
}

void edl_config_free(const edl_cfg_field *schema, void *out)
{
    if (schema && out) free_table(schema, out, 0);
}

static const char *type_name(edl_cfg_type t)
{
    switch (t) {
    case EDL_CFG_STRING: return "string";
    case EDL_CFG_INT: return "integer";
    case EDL_CFG_BOOL: return "boolean";
    case EDL_CFG_DOUBLE: return "number";
    case EDL_CFG_DURATION_MS: return "duration";
    case EDL_CFG_STRING_LIST: return "list of strings";
    case EDL_CFG_OBJECT: return "mapping";
    }
    return "?";
}

static void print_table(const edl_cfg_field *table, FILE *fp, char *path, size_t len, int depth)
{
    if (depth > EDL_CONFIG_MAX_DEPTH) return;
    for (const edl_cfg_field *f = table; f && f->name; f++) {
        size_t n = append(path, PATH_CAP, len, "%s%s", len ? "." : "", f->name);
        char range[64] = "";
        if ((f->type == EDL_CFG_INT || f->type == EDL_CFG_DURATION_MS) && (f->min || f->max))
            snprintf(range, sizeof range, " %" PRId64 "..%" PRId64 "%s", f->min, f->max,
                     f->type == EDL_CFG_DURATION_MS ? "ms" : "");
        fprintf(fp, "  %-28s %s%s%s%s%s\n", path, type_name(f->type), range, f->required ? ", required" : "",
                f->help ? "  " : "", f->help ? f->help : "");
        if (f->type == EDL_CFG_OBJECT) print_table(f->fields, fp, path, n, depth + 1);
        path[len] = '\0';
    }
}

void edl_config_print_help(const edl_cfg_field *schema, FILE *fp)
{
    char path[PATH_CAP] = "";
    if (schema && fp) print_table(schema, fp, path, 0, 0);
}
