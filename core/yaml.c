/* yaml.c: YAML documents read into cJSON trees with libyaml's event parser (edl/yaml.h), for
 * manifests that people write: `edl run -f job.yaml` reads a TrainingJob the way the API
 * server would, and a problem found later names the line it came from.
 *
 * Each document keeps a table from field path ("spec.template.spec.containers[0].command") to
 * the line of the node (for a mapping's value: the line of its key, where a reader looks).
 * The table also finds duplicate keys without a scan of the whole mapping. Anything that could
 * make a small file expensive is refused: aliases (no expansion at all), nesting past 64,
 * files over 4 MiB. */
#define _GNU_SOURCE /* asprintf */
#include "edl/yaml.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#define YAML_FILE_MAX ((size_t)4 << 20)
#define YAML_DEPTH_MAX 64
#define TAG_PREFIX "tag:yaml.org,2002:"

typedef struct line_entry {
    char *path; /* NULL: free slot */
    int line;
} line_entry;

typedef struct yaml_doc {
    cJSON *root;
    line_entry *tab; /* open addressing, cap a power of two */
    size_t cap, n;
} yaml_doc;

struct edl_yaml {
    char *name;
    yaml_doc *docs;
    size_t n, cap;
};

/* ---- the path table ----------------------------------------------------------------------- */

static uint64_t hash_path(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static const line_entry *tab_find(const yaml_doc *d, const char *path)
{
    if (!d->cap)
        return NULL;
    for (size_t i = hash_path(path) & (d->cap - 1);; i = (i + 1) & (d->cap - 1)) {
        if (!d->tab[i].path)
            return NULL;
        if (strcmp(d->tab[i].path, path) == 0)
            return &d->tab[i];
    }
}

static void tab_place(line_entry *tab, size_t cap, line_entry e)
{
    size_t i = hash_path(e.path) & (cap - 1);
    while (tab[i].path)
        i = (i + 1) & (cap - 1);
    tab[i] = e;
}

/* Takes path (freed on failure). A path seen before (keys with dots can collide) keeps its
 * first line. */
static int tab_add(yaml_doc *d, char *path, int line)
{
    if ((d->n + 1) * 2 > d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        line_entry *t = calloc(cap, sizeof *t);
        if (!t) {
            free(path);
            return EDL_ENOMEM;
        }
        for (size_t i = 0; i < d->cap; i++)
            if (d->tab[i].path)
                tab_place(t, cap, d->tab[i]);
        free(d->tab);
        d->tab = t;
        d->cap = cap;
    }
    tab_place(d->tab, d->cap, (line_entry){path, line});
    d->n++;
    return 0;
}

static void doc_free(yaml_doc *d)
{
    cJSON_Delete(d->root);
    for (size_t i = 0; i < d->cap; i++)
        free(d->tab[i].path);
    free(d->tab);
    memset(d, 0, sizeof *d);
}

/* ---- scalars ------------------------------------------------------------------------------- */

typedef enum { SC_STR, SC_NULL, SC_BOOL, SC_INT, SC_FLOAT } scalar_kind;

static bool all_of(const char *s, const char *set)
{
    return *s && strspn(s, set) == strlen(s);
}

/* What a plain scalar is under the YAML 1.2 core schema; *num gets a number's value. ".inf"
 * and ".nan" stay strings: JSON has no such numbers. */
static scalar_kind resolve_plain(const char *s, double *num, bool *range)
{
    *range = true;
    if (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL"))
        return SC_NULL;
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) {
        *num = 1;
        return SC_BOOL;
    }
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) {
        *num = 0;
        return SC_BOOL;
    }
    if ((s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) &&
        all_of(s + 2, s[1] == 'x' ? "0123456789abcdefABCDEF" : "01234567")) {
        errno = 0;
        unsigned long long v = strtoull(s + 2, NULL, s[1] == 'x' ? 16 : 8);
        *range = errno != ERANGE;
        *num = (double)v;
        return SC_INT;
    }
    const char *p = s + (*s == '-' || *s == '+');
    if (all_of(p, "0123456789")) {
        errno = 0;
        *num = strtod(s, NULL);
        *range = isfinite(*num);
        return SC_INT;
    }
    /* [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? */
    size_t ip = strspn(p, "0123456789"), fp = 0;
    const char *q = p + ip;
    if (*q == '.') {
        fp = strspn(q + 1, "0123456789");
        q += 1 + fp;
    }
    if (ip + fp == 0)
        return SC_STR;
    if (*q == 'e' || *q == 'E') {
        q++;
        q += (*q == '-' || *q == '+');
        size_t ep = strspn(q, "0123456789");
        if (!ep)
            return SC_STR;
        q += ep;
    }
    if (*q)
        return SC_STR;
    *num = strtod(s, NULL);
    *range = isfinite(*num);
    return SC_FLOAT;
}

/* ---- the event parser ------------------------------------------------------------------- */

typedef struct frame {
    cJSON *node;      /* an object or array, owned by its parent (or the document) */
    const char *path; /* borrowed from the table */
    char *key;        /* a mapping's key waiting for its value */
    char *key_path;   /* ... and that value's path */
    int key_line;
    int index;        /* a sequence's next index */
} frame;

typedef struct builder {
    yaml_parser_t p;
    const char *name;
    char *err;
    size_t errlen;
    yaml_doc doc;     /* the document being read */
    frame st[YAML_DEPTH_MAX];
    int depth;
} builder;

static int fail_at(builder *b, const yaml_mark_t *m, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_at(builder *b, const yaml_mark_t *m, int rc, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return edl_errf(b->err, b->errlen, rc, "%s:%zu:%zu: %s", b->name, m->line + 1, m->column + 1,
                    what);
}

static char *join_path(const char *parent, const char *key, int index)
{
    char *p = NULL;
    int n = key ? asprintf(&p, "%s%s%s", parent, *parent ? "." : "", key)
                : asprintf(&p, "%s[%d]", parent, index);
    return n < 0 ? NULL : p;
}

/* A key arrives where a mapping waits for one: check it is new, remember it for the value. */
static int take_key(builder *b, frame *f, const yaml_event_t *ev)
{
    const char *key = (const char *)ev->data.scalar.value;
    if (!*key) /* "? " or "\"\": x": no field, label or variable has an empty name */
        return fail_at(b, &ev->start_mark, EDL_EPROTO, "an empty key");
    char *path = join_path(f->path, key, 0);
    if (!path || !(f->key = strdup(key))) {
        free(path);
        return EDL_ENOMEM;
    }
    const line_entry *seen = tab_find(&b->doc, path);
    if (seen && cJSON_GetObjectItemCaseSensitive(f->node, key)) {
        free(path);
        return fail_at(b, &ev->start_mark, EDL_EPROTO, "duplicate key \"%s\" (first at line %d)",
                       key, seen->line);
    }
    f->key_path = path;
    f->key_line = (int)ev->start_mark.line + 1;
    return 0;
}

/* Hang a finished node on its parent (or make it the document); record its path and line.
 * Takes item (deleted on failure); *path receives the node's path in the table. */
static int attach(builder *b, cJSON *item, const yaml_mark_t *m, const char **path)
{
    char *p;
    int line = (int)m->line + 1, rc;
    if (b->depth == 0) {
        if (!(p = strdup("")) || (rc = tab_add(&b->doc, p, line)) != 0) {
            cJSON_Delete(item);
            return EDL_ENOMEM;
        }
        b->doc.root = item;
    } else {
        frame *f = &b->st[b->depth - 1];
        if (cJSON_IsObject(f->node)) {
            p = f->key_path;
            line = f->key_line;
            f->key_path = NULL;
            if ((rc = tab_add(&b->doc, p, line)) != 0) {
                cJSON_Delete(item);
                return rc;
            }
            cJSON_AddItemToObject(f->node, f->key, item);
            free(f->key);
            f->key = NULL;
        } else {
            if (!(p = join_path(f->path, NULL, f->index++)) || tab_add(&b->doc, p, line) != 0) {
                cJSON_Delete(item);
                return EDL_ENOMEM;
            }
            cJSON_AddItemToArray(f->node, item);
        }
    }
    if (path)
        *path = p;
    return 0;
}

static bool waits_for_key(const builder *b)
{
    return b->depth > 0 && cJSON_IsObject(b->st[b->depth - 1].node) && !b->st[b->depth - 1].key;
}

static int on_scalar(builder *b, const yaml_event_t *ev)
{
    const char *v = (const char *)ev->data.scalar.value;
    const char *tag = (const char *)ev->data.scalar.tag;
    if (strlen(v) != ev->data.scalar.length)
        return fail_at(b, &ev->start_mark, EDL_EPROTO, "a NUL character in a scalar");
    if (tag && strcmp(tag, "!") != 0 && strncmp(tag, TAG_PREFIX, strlen(TAG_PREFIX)) != 0)
        return fail_at(b, &ev->start_mark, EDL_EPROTO, "tag %s is not supported", tag);
    if (waits_for_key(b))
        return take_key(b, &b->st[b->depth - 1], ev);
    const char *want = tag && tag[0] != '!' ? tag + strlen(TAG_PREFIX) : NULL;
    double num = 0;
    bool range = true;
    scalar_kind k = SC_STR;
    if (want && strcmp(want, "str") != 0) {
        static const char *const names[] = {"str", "null", "bool", "int", "float"};
        k = resolve_plain(v, &num, &range);
        if (k == SC_INT && !strcmp(want, "float"))
            k = SC_FLOAT;
        if (strcmp(names[k], want) != 0)
            return fail_at(b, &ev->start_mark, EDL_EPROTO, "\"%s\" does not match its tag",
                           v);
    } else if (!tag && ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        k = resolve_plain(v, &num, &range);
    }
    if (!range)
        return fail_at(b, &ev->start_mark, EDL_EPROTO, "number %s is out of range", v);
    cJSON *item = k == SC_NULL   ? cJSON_CreateNull()
                  : k == SC_BOOL ? cJSON_CreateBool(num != 0)
                  : k == SC_STR  ? cJSON_CreateString(v)
                                 : cJSON_CreateNumber(num);
    if (!item)
        return EDL_ENOMEM;
    return attach(b, item, &ev->start_mark, NULL);
}

static int on_collection(builder *b, const yaml_event_t *ev, bool map)
{
    const char *tag = (const char *)(map ? ev->data.mapping_start.tag
                                         : ev->data.sequence_start.tag);
    if (waits_for_key(b))
        return fail_at(b, &ev->start_mark, EDL_EPROTO, "a key must be a scalar");
    if (tag && strcmp(tag, "!") != 0 && strcmp(tag, map ? TAG_PREFIX "map" : TAG_PREFIX "seq"))
        return fail_at(b, &ev->start_mark, EDL_EPROTO, "tag %s is not supported here", tag);
    if (b->depth >= YAML_DEPTH_MAX)
        return fail_at(b, &ev->start_mark, EDL_EPROTO, "nested deeper than 64 levels");
    cJSON *item = map ? cJSON_CreateObject() : cJSON_CreateArray();
    const char *path = NULL;
    if (!item)
        return EDL_ENOMEM;
    int rc = attach(b, item, &ev->start_mark, &path);
    if (rc)
        return rc;
    b->st[b->depth++] = (frame){.node = item, .path = path};
    return 0;
}

static void drop_frames(builder *b)
{
    while (b->depth > 0) {
        frame *f = &b->st[--b->depth];
        free(f->key);
        free(f->key_path);
    }
}

static int parse_error(builder *b)
{
    const yaml_parser_t *p = &b->p;
    if (p->error == YAML_MEMORY_ERROR)
        return edl_errf(b->err, b->errlen, EDL_ENOMEM, "%s: out of memory", b->name);
    const yaml_mark_t *m = p->problem ? &p->problem_mark : &p->mark;
    char what[400];
    snprintf(what, sizeof what, "%s%s%s", p->problem ? p->problem : "not valid YAML",
             p->context ? " " : "", p->context ? p->context : "");
    return edl_errf(b->err, b->errlen, EDL_EPROTO, "%s:%zu:%zu: %s", b->name, m->line + 1,
                    m->column + 1, what);
}

static int push_doc(edl_yaml *y, yaml_doc *d)
{
    if (y->n == y->cap) {
        size_t cap = y->cap ? y->cap * 2 : 4;
        yaml_doc *docs = realloc(y->docs, cap * sizeof *docs);
        if (!docs)
            return EDL_ENOMEM;
        y->docs = docs;
        y->cap = cap;
    }
    y->docs[y->n++] = *d;
    memset(d, 0, sizeof *d);
    return 0;
}

/* One event: 0 to go on, 1 at the end of the stream, or an EDL_E* code. */
static int on_event(builder *b, edl_yaml *y, const yaml_event_t *ev)
{
    switch (ev->type) {
    case YAML_STREAM_END_EVENT: return 1;
    case YAML_DOCUMENT_END_EVENT: return push_doc(y, &b->doc);
    case YAML_ALIAS_EVENT:
        return fail_at(b, &ev->start_mark, EDL_EPROTO, "aliases (*%s) are not supported",
                       (const char *)ev->data.alias.anchor);
    case YAML_SCALAR_EVENT:
    case YAML_MAPPING_START_EVENT:
    case YAML_SEQUENCE_START_EVENT: {
        const yaml_char_t *anchor = ev->type == YAML_SCALAR_EVENT ? ev->data.scalar.anchor
                                    : ev->type == YAML_MAPPING_START_EVENT
                                        ? ev->data.mapping_start.anchor
                                        : ev->data.sequence_start.anchor;
        if (anchor)
            return fail_at(b, &ev->start_mark, EDL_EPROTO, "anchors (&%s) are not supported",
                           (const char *)anchor);
        if (ev->type == YAML_SCALAR_EVENT)
            return on_scalar(b, ev);
        return on_collection(b, ev, ev->type == YAML_MAPPING_START_EVENT);
    }
    case YAML_MAPPING_END_EVENT:
    case YAML_SEQUENCE_END_EVENT:
        if (b->depth > 0)
            b->depth--;
        return 0;
    default: return 0;
    }
}

int edl_yaml_load(const char *name, const char *text, size_t len, edl_yaml **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    name = name ? name : "<yaml>";
    if (!text && len)
        return edl_errf(err, errlen, EDL_EINVAL, "%s: no text", name);
    if (len > YAML_FILE_MAX)
        return edl_errf(err, errlen, EDL_ETOOBIG, "%s: %zu bytes; at most %zu are read", name,
                        len, YAML_FILE_MAX);
    edl_yaml *y = calloc(1, sizeof *y);
    builder *b = calloc(1, sizeof *b);
    if (!y || !b || !(y->name = strdup(name)) || !yaml_parser_initialize(&b->p)) {
        free(b);
        edl_yaml_free(y);
        return edl_errf(err, errlen, EDL_ENOMEM, "%s: out of memory", name);
    }
    b->name = name;
    b->err = err;
    b->errlen = errlen;
    yaml_parser_set_input_string(&b->p, (const unsigned char *)(text ? text : ""), len);
    int rc = 0;
    while (rc == 0) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&b->p, &ev)) {
            rc = parse_error(b);
            break;
        }
        rc = on_event(b, y, &ev);
        yaml_event_delete(&ev);
    }
    drop_frames(b);
    doc_free(&b->doc);
    yaml_parser_delete(&b->p);
    free(b);
    if (rc == 1 && y->n == 0)
        rc = edl_errf(err, errlen, EDL_EPROTO, "%s: no YAML document in it (the file is empty)",
                      name);
    if (rc < 0) {
        edl_yaml_free(y);
        return rc;
    }
    *out = y;
    return 0;
}

int edl_yaml_load_file(const char *path, edl_yaml **out, char *err, size_t errlen)
{
    *out = NULL;
    char *buf;
    size_t len;
    int rc = edl_file_read(path, YAML_FILE_MAX, &buf, &len, err, errlen);
    if (rc == 0)
        rc = edl_yaml_load(path, buf, len, out, err, errlen);
    free(buf);
    return rc;
}

void edl_yaml_free(edl_yaml *y)
{
    if (!y)
        return;
    for (size_t i = 0; i < y->n; i++)
        doc_free(&y->docs[i]);
    free(y->docs);
    free(y->name);
    free(y);
}

size_t edl_yaml_count(const edl_yaml *y)
{
    return y ? y->n : 0;
}

const cJSON *edl_yaml_doc(const edl_yaml *y, size_t i)
{
    return y && i < y->n ? y->docs[i].root : NULL;
}

const char *edl_yaml_name(const edl_yaml *y)
{
    return y ? y->name : NULL;
}

int edl_yaml_line(const edl_yaml *y, size_t i, const char *field)
{
    if (!y || i >= y->n)
        return 0;
    const yaml_doc *d = &y->docs[i];
    char *p = strdup(field ? field : "");
    if (!p)
        return 0;
    for (;;) {
        const line_entry *e = tab_find(d, p);
        if (e || !*p) {
            free(p);
            return e ? e->line : 0;
        }
        /* the parent: drop the last ".key" or "[n]" */
        char *dot = strrchr(p, '.'), *br = strrchr(p, '[');
        char *cut = dot > br ? dot : br;
        if (cut)
            *cut = '\0';
        else
            p[0] = '\0';
    }
}
