/* names.c: the one check of a DNS-1123 label, the names that Kubernetes objects, pods and
 * distillation's services and instances share. */
#include "edl/common.h"

bool edl_dns_label_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n < 1 || n > EDL_DNS_LABEL_MAX || s[0] == '-' || s[n - 1] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return false;
    return true;
}
