/* base64.c: the strict base64 decoder for kubeconfig's *-data fields (certificates, keys).
 * Standard alphabet with padding, as kubectl writes them; white space (line breaks in a
 * folded YAML scalar) is skipped; anything else is refused rather than guessed at. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int b64_value(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '+')
        return 62;
    if (ch == '/')
        return 63;
    return -1;
}

static bool b64_space(unsigned char ch)
{
    return ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t';
}

int k8s_b64_decode(const char *in, size_t n, char **out, size_t *outlen)
{
    *out = NULL;
    char *d = malloc(n / 4 * 3 + 4);
    if (!d)
        return EDL_ENOMEM;
    size_t o = 0, quad = 0, pad = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)in[i];
        if (b64_space(ch))
            continue;
        int v = ch == '=' ? 0 : b64_value(ch);
        /* '=' only in the last two places of the last quad; nothing after it but '=' */
        if (v < 0 || (ch == '=' && quad < 2) || (pad && ch != '='))
            goto bad;
        pad += ch == '=';
        acc = acc << 6 | (uint32_t)v;
        if (++quad == 4) {
            d[o++] = (char)(acc >> 16);
            if (pad < 2)
                d[o++] = (char)(acc >> 8);
            if (pad < 1)
                d[o++] = (char)acc;
            quad = 0;
            acc = 0;
            if (pad)
                pad = 3; /* the end: any further character is refused above */
        }
    }
    if (quad != 0 || o == 0)
        goto bad;
    d[o] = '\0';
    *out = d;
    if (outlen)
        *outlen = o;
    return 0;
bad:
    free(d);
    return EDL_EPROTO;
}
