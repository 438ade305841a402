/* names.c: the name and label checks of the real API server
 * (k8s.io/apimachinery/pkg/util/validation and path.IsValidPathSegmentName) with its messages:
 * DNS-1123 labels and subdomains, DNS-1035 labels, path segment names, label values; which
 * kind's name takes which rule (a Service's is a DNS-1035 label, a Namespace's a DNS-1123
 * label, RBAC objects' a path segment, every other a DNS-1123 subdomain). */
#include <ctype.h>
#include <string.h>

#include "standin.h"

static const char LABEL_MSG[] =
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
static const char SUBDOMAIN_MSG[] =
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
static const char DNS1035_MSG[] =
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
static const char VALUE_MSG[] =
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

static bool lower_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* [a-z0-9]([-a-z0-9]*[a-z0-9])? over s[0, n) (no length limit: the callers check it). */
static bool label_part(const char *s, size_t n)
{
    if (n == 0 || !lower_alnum(s[0]) || !lower_alnum(s[n - 1]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!lower_alnum(s[i]) && s[i] != '-')
            return false;
    return true;
}

static bool subdomain_ok(const char *s)
{
    for (const char *p = s;;) {
        size_t n = strcspn(p, ".");
        if (!label_part(p, n))
            return false;
        if (!p[n])
            return true;
        p += n + 1;
    }
}

static bool value_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0)
        return true;
    if (!isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[n - 1]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.", s[i]))
            return false;
    return true;
}

/* The messages the real check gives for s (none when valid): at most 4. */
static int name_errors(enum si_name_rule rule, const char *s, const char *msgs[4])
{
    size_t len = strlen(s);
    int n = 0;
    if (rule == SI_PATH_SEGMENT) {
        if (!strcmp(s, ".") || !strcmp(s, ".."))
            msgs[n++] = s[1] ? "may not be '..'" : "may not be '.'";
        if (strchr(s, '/'))
            msgs[n++] = "may not contain '/'";
        if (strchr(s, '%'))
            msgs[n++] = "may not contain '%'";
        return n;
    }
    size_t max = rule == SI_DNS1123_SUBDOMAIN ? 253 : 63;
    if (len > max)
        msgs[n++] = max == 253 ? "must be no more than 253 characters"
                               : "must be no more than 63 characters";
    if (rule == SI_DNS1123_LABEL && !label_part(s, len))
        msgs[n++] = LABEL_MSG;
    else if (rule == SI_DNS1123_SUBDOMAIN && !subdomain_ok(s))
        msgs[n++] = SUBDOMAIN_MSG;
    else if (rule == SI_DNS1035_LABEL && !(label_part(s, len) && islower((unsigned char)s[0])))
        msgs[n++] = DNS1035_MSG;
    else if (rule == SI_LABEL_VALUE && !value_ok(s))
        msgs[n++] = VALUE_MSG;
    return n;
}

bool si_name_ok(enum si_name_rule rule, const char *s)
{
    const char *msgs[4];
    return s && name_errors(rule, s, msgs) == 0;
}

void si_check_name(enum si_name_rule rule, const char *value, const char *field, cJSON *causes)
{
    const char *msgs[4];
    int n = name_errors(rule, value, msgs);
    for (int i = 0; i < n; i++)
        si_cause(causes, "FieldValueInvalid", field, "Invalid value: \"%s\": %s", value, msgs[i]);
}

enum si_name_rule si_name_rule_of(const si_resource *r)
{
    if (r->is_crd)
        return SI_DNS1123_SUBDOMAIN;
    if (!r->group[0] && !strcmp(r->plural, "services"))
        return SI_DNS1035_LABEL;
    if (!r->group[0] && !strcmp(r->plural, "namespaces"))
        return SI_DNS1123_LABEL;
    if (!strcmp(r->group, "rbac.authorization.k8s.io"))
        return SI_PATH_SEGMENT;
    return SI_DNS1123_SUBDOMAIN;
}

void si_check_labels(const cJSON *obj, cJSON *causes)
{
    const cJSON *v;
    cJSON_ArrayForEach(v, si_get(obj, "metadata.labels")) if (cJSON_IsString(v))
        si_check_name(SI_LABEL_VALUE, v->valuestring, "metadata.labels", causes);
}
