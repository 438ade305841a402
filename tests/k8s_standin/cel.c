/* cel.c: a small, honest evaluator of the part of the Common Expression Language that CRD
 * validation rules (x-kubernetes-validations, see rules.c) use here. Literals: int (decimal),
 * string ('..' or "..", with \\ \' \" \n \t escapes; r'..' raw), bool; `self` and field
 * selection (`self.a.b`); has(self.a); size(x) and x.size() (string: code points; list, map:
 * entries); x.matches(re), where re is a POSIX extended regular expression (regex.h, not RE2:
 * \d, (?i) and the like do not compile); ! and unary -; && and || (an error on one side is
 * absorbed when the other decides, as in CEL); == and != on any values (different types are
 * unequal), < <= > >= on numbers, strings and bools; parentheses. Numbers are compared as
 * numbers whatever their JSON form. Anything else (oldSelf, +, ?:, [i], in, other functions,
 * double literals) does not parse: the CRD that holds it is refused. A checker compares the
 * fields a rule selects with the schema, as the real compiler does. */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

enum kind { N_INT, N_STR, N_BOOL, N_SELF, N_SELECT, N_HAS, N_SIZE, N_MATCHES, N_NOT, N_NEG,
            N_AND, N_OR, N_EQ, N_NE, N_LT, N_LE, N_GT, N_GE };

struct si_cel {
    enum kind k;
    struct si_cel *a, *b;
    char *s; /* string literal, or the selected field */
    double num;
    int col;
};

typedef struct parser {
    const char *src, *p;
    char *err;
    size_t errlen;
} parser;

/* ---- parsing ----------------------------------------------------------------------------- */

static si_cel *node(enum kind k, si_cel *a, si_cel *b, int col)
{
    si_cel *n = calloc(1, sizeof *n);
    n->k = k;
    n->a = a;
    n->b = b;
    n->col = col;
    return n;
}

void si_cel_free(si_cel *c)
{
    if (!c)
        return;
    si_cel_free(c->a);
    si_cel_free(c->b);
    free(c->s);
    free(c);
}

static int col(const parser *ps)
{
    return (int)(ps->p - ps->src) + 1;
}

static si_cel *fail(parser *ps, int at, const char *what)
{
    if (!ps->err[0])
        snprintf(ps->err, ps->errlen, "<input>:1:%d: %s", at, what);
    return NULL;
}

static void skip_space(parser *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
        ps->p++;
}

static bool accept(parser *ps, const char *op)
{
    skip_space(ps);
    size_t n = strlen(op);
    if (strncmp(ps->p, op, n))
        return false;
    if (n == 1 && (op[0] == '<' || op[0] == '>' || op[0] == '!') && ps->p[1] == '=')
        return false; /* "<" is not the start of "<=" */
    ps->p += n;
    return true;
}

static bool ident_char(char c, bool first)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
}

static size_t ident(parser *ps, char *out, size_t len)
{
    skip_space(ps);
    size_t n = 0;
    while (ident_char(ps->p[n], n == 0))
        n++;
    if (n == 0 || n >= len)
        return 0;
    memcpy(out, ps->p, n);
    out[n] = '\0';
    ps->p += n;
    return n;
}

static si_cel *parse_expr(parser *ps);

static char escape(char c)
{
    return c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
}

static si_cel *parse_string(parser *ps, bool raw)
{
    int at = col(ps);
    char q = *ps->p++, *out = malloc(strlen(ps->p) + 1);
    size_t n = 0;
    while (*ps->p && *ps->p != q) {
        if (!raw && *ps->p == '\\' && ps->p[1]) {
            if (!strchr("\\'\"ntr", ps->p[1])) {
                free(out);
                return fail(ps, col(ps), "Syntax error: an escape k8s-standin does not read");
            }
            out[n++] = escape(ps->p[1]);
            ps->p += 2;
        } else {
            out[n++] = *ps->p++;
        }
    }
    out[n] = '\0';
    if (*ps->p != q) {
        free(out);
        return fail(ps, at, "Syntax error: token recognition error (an unterminated string)");
    }
    ps->p++;
    si_cel *s = node(N_STR, NULL, NULL, at);
    s->s = out;
    return s;
}

static si_cel *parse_call(parser *ps, const char *name, int at)
{
    si_cel *arg = parse_expr(ps);
    if (!arg || !accept(ps, ")")) {
        si_cel_free(arg);
        return fail(ps, col(ps), "Syntax error: missing ')'");
    }
    if (!strcmp(name, "size"))
        return node(N_SIZE, arg, NULL, at);
    if (arg->k != N_SELECT) {
        si_cel_free(arg);
        return fail(ps, at, "invalid argument to has() macro");
    }
    return node(N_HAS, arg, NULL, at);
}

static si_cel *parse_ident(parser *ps)
{
    char name[64];
    int at = col(ps);
    if (!ident(ps, name, sizeof name))
        return fail(ps, at, "Syntax error: an expression expected");
    if (!strcmp(name, "r") && (*ps->p == '\'' || *ps->p == '"'))
        return parse_string(ps, true);
    if (!strcmp(name, "true") || !strcmp(name, "false")) {
        si_cel *b = node(N_BOOL, NULL, NULL, at);
        b->num = name[0] == 't';
        return b;
    }
    if (!strcmp(name, "self"))
        return node(N_SELF, NULL, NULL, at);
    if ((!strcmp(name, "has") || !strcmp(name, "size")) && accept(ps, "("))
        return parse_call(ps, name, at);
    if (!strcmp(name, "oldSelf"))
        return fail(ps, at, "k8s-standin does not evaluate transition rules (oldSelf)");
    char msg[200];
    snprintf(msg, sizeof msg, "undeclared reference to '%s' (k8s-standin knows self, has() and size())", name);
    return fail(ps, at, msg);
}

static si_cel *parse_primary(parser *ps)
{
    skip_space(ps);
    int at = col(ps);
    if (accept(ps, "(")) {
        si_cel *e = parse_expr(ps);
        if (e && !accept(ps, ")")) {
            si_cel_free(e);
            return fail(ps, col(ps), "Syntax error: missing ')'");
        }
        return e;
    }
    if (*ps->p == '\'' || *ps->p == '"')
        return parse_string(ps, false);
    if (*ps->p >= '0' && *ps->p <= '9') {
        char *end;
        double v = (double)strtoll(ps->p, &end, 10);
        if (*end == '.' || *end == 'e' || *end == 'u' || *end == 'x')
            return fail(ps, at, "Syntax error: k8s-standin reads decimal int literals only");
        ps->p = end;
        si_cel *n = node(N_INT, NULL, NULL, at);
        n->num = v;
        return n;
    }
    return parse_ident(ps);
}

/* x.field, x.size(), x.matches(re) */
static si_cel *parse_member(parser *ps)
{
    si_cel *x = parse_primary(ps);
    while (x && accept(ps, ".")) {
        char name[128];
        int at = col(ps);
        if (!ident(ps, name, sizeof name)) {
            si_cel_free(x);
            return fail(ps, at, "Syntax error: a field name expected");
        }
        if (!accept(ps, "(")) {
            x = node(N_SELECT, x, NULL, at);
            x->s = strdup(name);
        } else if (!strcmp(name, "size") && accept(ps, ")")) {
            x = node(N_SIZE, x, NULL, at);
        } else if (!strcmp(name, "matches")) {
            si_cel *re = parse_expr(ps);
            x = node(N_MATCHES, x, re, at);
            if (!re || !accept(ps, ")")) {
                si_cel_free(x);
                return fail(ps, col(ps), "Syntax error: missing ')'");
            }
        } else {
            si_cel_free(x);
            return fail(ps, at, "k8s-standin knows the methods size() and matches() only");
        }
    }
    return x;
}

static si_cel *parse_unary(parser *ps)
{
    skip_space(ps);
    int at = col(ps);
    if (accept(ps, "!") || accept(ps, "-")) {
        enum kind k = ps->p[-1] == '!' ? N_NOT : N_NEG;
        si_cel *x = parse_unary(ps);
        return x ? node(k, x, NULL, at) : NULL;
    }
    return parse_member(ps);
}

static si_cel *parse_relation(parser *ps)
{
    static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
    static const enum kind kinds[] = {N_EQ, N_NE, N_LE, N_GE, N_LT, N_GT};
    si_cel *x = parse_unary(ps);
    while (x) { /* relations chain, left to right: a < b == true */
        int at = col(ps);
        size_t i = 0;
        while (i < 6 && !accept(ps, ops[i]))
            i++;
        if (i == 6)
            break;
        si_cel *y = parse_unary(ps);
        if (!y) {
            si_cel_free(x);
            return NULL;
        }
        x = node(kinds[i], x, y, at);
    }
    return x;
}

static si_cel *parse_binary(parser *ps, const char *op)
{
    bool is_or = !strcmp(op, "||");
    si_cel *x = is_or ? parse_binary(ps, "&&") : parse_relation(ps);
    while (x) {
        int at = col(ps);
        if (!accept(ps, op))
            break;
        si_cel *y = is_or ? parse_binary(ps, "&&") : parse_relation(ps);
        if (!y) {
            si_cel_free(x);
            return NULL;
        }
        x = node(is_or ? N_OR : N_AND, x, y, at);
    }
    return x;
}

static si_cel *parse_expr(parser *ps)
{
    return parse_binary(ps, "||");
}

si_cel *si_cel_parse(const char *rule, char *err, size_t errlen)
{
    parser ps = {rule, rule, err, errlen};
    err[0] = '\0';
    si_cel *c = parse_expr(&ps);
    skip_space(&ps);
    if (c && *ps.p) {
        si_cel_free(c);
        return fail(&ps, col(&ps), "Syntax error: extraneous input (k8s-standin's CEL subset ends here)");
    }
    if (c && (c->k == N_INT || c->k == N_STR || c->k == N_NEG || c->k == N_SIZE)) {
        si_cel_free(c);
        return fail(&ps, 1, "a rule must evaluate to a bool");
    }
    return c;
}

/* ---- checking against the schema --------------------------------------------------------- */

typedef struct checker {
    const cJSON *self, *meta; /* the rule's schema; at the root, what metadata offers */
    char *err;
    size_t errlen;
} checker;

/* "<input>:1:<at>: <before><arg><after>" */
static int check_fail(checker *ck, int at, const char *before, const char *arg, const char *after)
{
    if (!ck->err[0])
        snprintf(ck->err, ck->errlen, "<input>:1:%d: %s%s%s", at, before, arg, after);
    return -1;
}

/* The schema of field `key` of a value whose schema is s (NULL: not known, anything goes). */
static int field_schema(checker *ck, const cJSON *s, const si_cel *sel, const cJSON **out)
{
    *out = NULL;
    if (!s || cJSON_IsTrue(cJSON_GetObjectItem(s, "x-kubernetes-preserve-unknown-fields")) ||
        cJSON_IsTrue(cJSON_GetObjectItem(s, "x-kubernetes-int-or-string")))
        return 0;
    const char *type = si_str(s, "type");
    if (type && strcmp(type, "object"))
        return check_fail(ck, sel->col, "type '", type, "' does not support field selection");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(s, "properties"), sel->s);
    const cJSON *a = cJSON_GetObjectItem(s, "additionalProperties");
    if (p || cJSON_IsObject(a)) {
        *out = p ? p : a;
        return 0;
    }
    return check_fail(ck, sel->col, "undefined field '", sel->s, "'");
}

/* The schema of what node n yields (NULL when not a selection of self). */
static int check_node(checker *ck, const si_cel *n, const cJSON **schema)
{
    const cJSON *sa = NULL, *sb = NULL;
    *schema = NULL;
    if (n->k == N_SELF) {
        *schema = ck->self;
        return 0;
    }
    if ((n->a && check_node(ck, n->a, &sa)) || (n->b && check_node(ck, n->b, &sb)))
        return -1;
    if (n->k == N_SELECT && ck->meta && n->a->k == N_SELF && !strcmp(n->s, "metadata")) {
        *schema = ck->meta; /* the root's metadata: name and generateName only */
        return 0;
    }
    if (n->k == N_SELECT)
        return field_schema(ck, sa, n, schema);
    if (n->k == N_MATCHES && n->b->k == N_STR) {
        regex_t re;
        if (regcomp(&re, n->b->s, REG_EXTENDED | REG_NOSUB))
            return check_fail(ck, n->b->col, "k8s-standin cannot compile the regular expression '",
                              n->b->s, "' (POSIX extended, not RE2)");
        regfree(&re);
    }
    return 0;
}

int si_cel_check(const si_cel *c, const cJSON *schema, bool root, char *err, size_t errlen)
{
    cJSON *meta = root ? cJSON_Parse("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
                                     "\"string\"},\"generateName\":{\"type\":\"string\"}}}")
                       : NULL;
    checker ck = {schema, meta, err, errlen};
    const cJSON *out;
    err[0] = '\0';
    int rc = check_node(&ck, c, &out);
    cJSON_Delete(meta);
    return rc;
}

/* ---- evaluation -------------------------------------------------------------------------- */

typedef enum { V_ERR, V_NULL, V_BOOL, V_NUM, V_STR, V_LIST, V_MAP } vkind;

typedef struct val {
    vkind k;
    bool b;
    double n;
    const char *s;
    const cJSON *j;
} val;

typedef struct evaluator {
    char *err;
    size_t errlen;
} evaluator;

/* An evaluation error: "<what><arg>". */
static val err_val(evaluator *ev, const char *what, const char *arg)
{
    if (!ev->err[0])
        snprintf(ev->err, ev->errlen, "%s%s", what, arg);
    return (val){.k = V_ERR};
}

static val of_json(const cJSON *j)
{
    if (cJSON_IsBool(j))
        return (val){.k = V_BOOL, .b = cJSON_IsTrue(j)};
    if (cJSON_IsNumber(j))
        return (val){.k = V_NUM, .n = j->valuedouble};
    if (cJSON_IsString(j))
        return (val){.k = V_STR, .s = j->valuestring};
    if (cJSON_IsArray(j) || cJSON_IsObject(j))
        return (val){.k = cJSON_IsArray(j) ? V_LIST : V_MAP, .j = j};
    return (val){.k = V_NULL};
}

static val eval(evaluator *ev, const si_cel *n, const cJSON *self);

/* A field that is absent or null is not there (has() false, selecting it an error). */
static const cJSON *field(const val *base, const char *key)
{
    const cJSON *f = base->k == V_MAP ? cJSON_GetObjectItemCaseSensitive(base->j, key) : NULL;
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static val eval_size(evaluator *ev, val v)
{
    if (v.k == V_STR) {
        double n = 0;
        for (const char *p = v.s; *p; p++)
            n += ((unsigned char)*p & 0xC0) != 0x80; /* code points, not bytes */
        return (val){.k = V_NUM, .n = n};
    }
    if (v.k == V_LIST || v.k == V_MAP)
        return (val){.k = V_NUM, .n = cJSON_GetArraySize(v.j)};
    return v.k == V_ERR ? v : err_val(ev, "no such overload: ", "size()");
}

static val eval_matches(evaluator *ev, val s, val re)
{
    regex_t rx;
    if (s.k == V_ERR || re.k == V_ERR)
        return s.k == V_ERR ? s : re;
    if (s.k != V_STR || re.k != V_STR)
        return err_val(ev, "no such overload: ", "matches()");
    if (regcomp(&rx, re.s, REG_EXTENDED | REG_NOSUB))
        return err_val(ev, "error parsing regexp (POSIX extended): ", re.s);
    bool hit = regexec(&rx, s.s, 0, NULL, 0) == 0;
    regfree(&rx);
    return (val){.k = V_BOOL, .b = hit};
}

/* && and ||: the side that decides wins over an error on the other side, as in CEL. */
static val eval_logic(evaluator *ev, const si_cel *n, const cJSON *self)
{
    bool is_or = n->k == N_OR;
    val a = eval(ev, n->a, self);
    if (a.k == V_BOOL && a.b == is_or)
        return a;
    val b = eval(ev, n->b, self);
    if (b.k == V_BOOL && b.b == is_or) {
        ev->err[0] = '\0'; /* an error of a, absorbed */
        return b;
    }
    if (a.k == V_ERR || b.k == V_ERR)
        return a.k == V_ERR ? a : b;
    if (a.k != V_BOOL || b.k != V_BOOL)
        return err_val(ev, "no such overload: ", is_or ? "_||_" : "_&&_");
    return (val){.k = V_BOOL, .b = is_or ? (a.b || b.b) : (a.b && b.b)};
}

static bool equal(val a, val b)
{
    if (a.k != b.k)
        return false;
    switch (a.k) {
    case V_BOOL: return a.b == b.b;
    case V_NUM: return a.n == b.n;
    case V_STR: return !strcmp(a.s, b.s);
    case V_LIST:
    case V_MAP: return cJSON_Compare(a.j, b.j, true);
    default: return true;
    }
}

static val eval_compare(evaluator *ev, const si_cel *n, const cJSON *self)
{
    val a = eval(ev, n->a, self), b = eval(ev, n->b, self);
    if (a.k == V_ERR || b.k == V_ERR)
        return a.k == V_ERR ? a : b;
    if (n->k == N_EQ || n->k == N_NE)
        return (val){.k = V_BOOL, .b = equal(a, b) == (n->k == N_EQ)};
    int c;
    if (a.k == V_NUM && b.k == V_NUM)
        c = (a.n > b.n) - (a.n < b.n);
    else if (a.k == V_STR && b.k == V_STR)
        c = strcmp(a.s, b.s);
    else if (a.k == V_BOOL && b.k == V_BOOL)
        c = (int)a.b - (int)b.b;
    else
        return err_val(ev, "no such overload: ", "a comparison of different types");
    bool r = n->k == N_LT ? c < 0 : n->k == N_LE ? c <= 0 : n->k == N_GT ? c > 0 : c >= 0;
    return (val){.k = V_BOOL, .b = r};
}

static val eval_select(evaluator *ev, const si_cel *n, const cJSON *self, bool presence)
{
    val base = eval(ev, n->a, self);
    if (base.k == V_ERR)
        return base;
    if (base.k != V_MAP)
        return err_val(ev, "no such overload: ", "a field of a value that is no map");
    const cJSON *f = field(&base, n->s);
    if (presence)
        return (val){.k = V_BOOL, .b = f != NULL};
    return f ? of_json(f) : err_val(ev, "no such key: ", n->s);
}

static val eval(evaluator *ev, const si_cel *n, const cJSON *self)
{
    val v;
    switch (n->k) {
    case N_INT: return (val){.k = V_NUM, .n = n->num};
    case N_STR: return (val){.k = V_STR, .s = n->s};
    case N_BOOL: return (val){.k = V_BOOL, .b = n->num != 0};
    case N_SELF: return of_json(self);
    case N_SELECT: return eval_select(ev, n, self, false);
    case N_HAS: return eval_select(ev, n->a, self, true);
    case N_SIZE: return eval_size(ev, eval(ev, n->a, self));
    case N_MATCHES: return eval_matches(ev, eval(ev, n->a, self), eval(ev, n->b, self));
    case N_NOT:
    case N_NEG:
        v = eval(ev, n->a, self);
        if (n->k == N_NOT && v.k == V_BOOL)
            return (val){.k = V_BOOL, .b = !v.b};
        if (n->k == N_NEG && v.k == V_NUM)
            return (val){.k = V_NUM, .n = -v.n};
        return v.k == V_ERR ? v : err_val(ev, "no such overload: ", n->k == N_NOT ? "!_" : "-_");
    case N_AND:
    case N_OR: return eval_logic(ev, n, self);
    default: return eval_compare(ev, n, self);
    }
}

int si_cel_eval(const si_cel *c, const cJSON *self, char *err, size_t errlen)
{
    evaluator ev = {err, errlen};
    err[0] = '\0';
    val v = eval(&ev, c, self);
    if (v.k == V_BOOL)
        return v.b ? 1 : 0;
    if (v.k != V_ERR)
        snprintf(err, errlen, "the rule did not evaluate to a bool");
    return -1;
}
