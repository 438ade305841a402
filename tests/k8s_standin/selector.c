/* selector.c: label selectors (`a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x)`)
 * and field selectors (`metadata.name=x`, `status.phase!=Running`, any dotted path compared as
 * a string), as LIST and WATCH take them. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

enum op { OP_EQ, OP_NE, OP_EXISTS, OP_NOT_EXISTS, OP_IN, OP_NOTIN };

typedef struct req {
    enum op op;
    char key[320];
    char values[16][64];
    int nvalues;
} req;

struct si_selector {
    bool fields;
    int n;
    req reqs[32];
};

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static int copy_to(char *dst, size_t len, const char *src)
{
    if (strlen(src) >= len)
        return -1;
    strcpy(dst, src);
    return 0;
}

/* "(a, b)" into the requirement's values. */
static int parse_set(req *r, char *s)
{
    s = trim(s);
    size_t n = strlen(s);
    if (n < 2 || s[0] != '(' || s[n - 1] != ')')
        return -1;
    s[n - 1] = '\0';
    for (char *save = NULL, *tok = strtok_r(s + 1, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (r->nvalues == 16 || copy_to(r->values[r->nvalues++], 64, trim(tok)))
            return -1;
    }
    return 0;
}

static int parse_req(req *r, char *s, bool fields)
{
    s = trim(s);
    char *p;
    memset(r, 0, sizeof *r);
    if ((p = strstr(s, "!=")) || (p = strstr(s, "==")) || (p = strchr(s, '='))) {
        r->op = *p == '!' ? OP_NE : OP_EQ;
        *p = '\0';
        p += (r->op == OP_NE || p[1] == '=') ? 2 : 1;
        r->nvalues = 1;
        return copy_to(r->key, sizeof r->key, trim(s)) || copy_to(r->values[0], 64, trim(p)) ||
                       !r->key[0]
                   ? -1
                   : 0;
    }
    if (fields)
        return -1;
    if ((p = strstr(s, " notin ")) || (p = strstr(s, " in "))) {
        r->op = p[1] == 'n' ? OP_NOTIN : OP_IN;
        *p = '\0';
        return copy_to(r->key, sizeof r->key, trim(s)) ||
                       parse_set(r, p + (r->op == OP_IN ? 4 : 7))
                   ? -1
                   : 0;
    }
    r->op = OP_EXISTS;
    if (*s == '!') {
        r->op = OP_NOT_EXISTS;
        s = trim(s + 1);
    }
    return copy_to(r->key, sizeof r->key, s) || !r->key[0] || strpbrk(s, " ()") ? -1 : 0;
}

si_selector *si_selector_parse(const char *text, bool fields, char *err, size_t errlen)
{
    if (!text || !*text)
        return NULL;
    si_selector *sel = calloc(1, sizeof *sel);
    sel->fields = fields;
    char *buf = strdup(text), *start = buf;
    int depth = 0;
    for (char *p = buf;; p++) {
        if (*p == '(')
            depth++;
        if (*p == ')')
            depth--;
        if ((*p == ',' && depth == 0) || !*p) {
            bool end = !*p;
            *p = '\0';
            if (sel->n == 32 || parse_req(&sel->reqs[sel->n++], start, fields)) {
                snprintf(err, errlen, "unable to parse requirement: \"%s\"", start);
                free(buf);
                free(sel);
                return (si_selector *)-1;
            }
            if (end)
                break;
            start = p + 1;
        }
    }
    free(buf);
    return sel;
}

static bool in_set(const req *r, const char *v)
{
    for (int i = 0; i < r->nvalues; i++)
        if (!strcmp(r->values[i], v))
            return true;
    return false;
}

/* The value a field selector sees: strings as they are, numbers and booleans printed. */
static const char *field_value(const cJSON *obj, const char *key, char *buf, size_t len)
{
    const cJSON *v = si_get(obj, key);
    if (cJSON_IsString(v))
        return v->valuestring;
    if (cJSON_IsNumber(v)) {
        snprintf(buf, len, "%.0f", v->valuedouble);
        return buf;
    }
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v) ? "true" : "false";
    return v ? NULL : "";
}

static bool match_req(const req *r, const cJSON *obj, bool fields)
{
    char buf[64];
    const char *v;
    if (fields)
        v = field_value(obj, r->key, buf, sizeof buf);
    else {
        const cJSON *labels = si_get(obj, "metadata.labels");
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(labels, r->key);
        v = cJSON_IsString(l) ? l->valuestring : NULL;
    }
    switch (r->op) {
    case OP_EQ: return v && !strcmp(v, r->values[0]);
    case OP_NE: return !v || strcmp(v, r->values[0]);
    case OP_EXISTS: return v != NULL;
    case OP_NOT_EXISTS: return v == NULL;
    case OP_IN: return v && in_set(r, v);
    case OP_NOTIN: return !v || !in_set(r, v);
    }
    return false;
}

bool si_selector_match(const si_selector *sel, const cJSON *obj)
{
    if (!sel)
        return true;
    for (int i = 0; i < sel->n; i++)
        if (!match_req(&sel->reqs[i], obj, sel->fields))
            return false;
    return true;
}

void si_selector_free(si_selector *sel)
{
    if (sel != (si_selector *)-1)
        free(sel);
}
