/* certs.c: a throwaway certificate authority for a local etcd (edl run): a CA that signs one
 * server certificate (127.0.0.1, localhost) and one client certificate, all EC P-256, written
 * as PEM files readable by this user only. The CA's key never leaves memory, so nobody can
 * sign another certificate that this etcd would accept. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "edl/common.h"
#include "edl/etcd_server.h"

enum cert_kind { KIND_CA, KIND_SERVER, KIND_CLIENT };

static bool add_ext(X509 *x, X509V3_CTX *ctx, int nid, const char *value)
{
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, ctx, nid, value);
    bool ok = e && X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    return ok;
}

static bool add_exts(X509 *x, X509 *issuer, enum cert_kind kind)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer ? issuer : x, x, NULL, NULL, 0);
    bool ok = add_ext(x, &ctx, NID_basic_constraints,
                      kind == KIND_CA ? "critical,CA:TRUE,pathlen:0" : "critical,CA:FALSE") &&
              add_ext(x, &ctx, NID_key_usage, kind == KIND_CA ? "critical,keyCertSign,cRLSign"
                                                              : "critical,digitalSignature") &&
              add_ext(x, &ctx, NID_subject_key_identifier, "hash");
    if (ok && kind != KIND_CA)
        ok = add_ext(x, &ctx, NID_authority_key_identifier, "keyid:always") &&
             /* etcd's own gateway presents the server certificate as a client */
             add_ext(x, &ctx, NID_ext_key_usage, kind == KIND_SERVER ? "serverAuth,clientAuth"
                                                                     : "clientAuth");
    if (ok && kind == KIND_SERVER)
        ok = add_ext(x, &ctx, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
    return ok;
}

/* A random positive 64-bit serial number. */
static bool set_serial(X509 *x)
{
    BIGNUM *bn = BN_new();
    bool ok = bn && BN_rand(bn, 64, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) &&
              BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
    BN_free(bn);
    return ok;
}

/* A certificate for key, signed by issuer (NULL: self-signed). NULL on failure. */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key,
                       enum cert_kind kind, int days)
{
    X509 *x = X509_new();
    X509_NAME *name = x ? X509_get_subject_name(x) : NULL;
    bool ok = x && X509_set_version(x, 2) && set_serial(x) &&
              X509_gmtime_adj(X509_getm_notBefore(x), -300) &&
              X509_gmtime_adj(X509_getm_notAfter(x), (long)days * 86400) &&
              X509_set_pubkey(x, key) &&
              X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn,
                                         -1, -1, 0) &&
              X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name) &&
              add_exts(x, issuer, kind) &&
              X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256()) > 0;
    if (!ok) {
        X509_free(x);
        return NULL;
    }
    return x;
}

/* Write a certificate or a key to dir/name, mode 0600, refusing to replace anything. */
static int write_pem(const char *dir, const char *name, X509 *cert, EVP_PKEY *key, char *err,
                     size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return edl_errf(err, errlen, EDL_EIO, "%s: %s", path, strerror(e));
    }
    bool ok = cert ? PEM_write_X509(f, cert) : PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL,
                                                                    NULL);
    ok = fclose(f) == 0 && ok;
    return ok ? 0 : edl_errf(err, errlen, EDL_EIO, "%s: cannot be written", path);
}

/* One leaf: a new key, its certificate signed by the CA, both written. */
static int make_leaf(const char *dir, const char *name, const char *cn, enum cert_kind kind,
                     X509 *ca, EVP_PKEY *ca_key, int days, char *err, size_t errlen)
{
    char file[64];
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *cert = key ? make_cert(key, cn, ca, ca_key, kind, days) : NULL;
    int rc = cert ? 0 : edl_errf(err, errlen, EDL_EIO, "OpenSSL could not make the %s "
                                 "certificate: %s", name, ERR_reason_error_string(ERR_get_error()));
    snprintf(file, sizeof file, "%s.crt", name);
    if (!rc)
        rc = write_pem(dir, file, cert, NULL, err, errlen);
    snprintf(file, sizeof file, "%s.key", name);
    if (!rc)
        rc = write_pem(dir, file, NULL, key, err, errlen);
    X509_free(cert);
    EVP_PKEY_free(key);
    return rc;
}

int edl_etcd_tls_make(const char *dir, int days, char *err, size_t errlen)
{
    if (!dir || days < 1)
        return edl_errf(err, errlen, EDL_EINVAL, "edl_etcd_tls_make: a directory and days >= 1");
    EVP_PKEY *ca_key = EVP_EC_gen("P-256");
    X509 *ca = ca_key ? make_cert(ca_key, "edl throwaway CA", NULL, NULL, KIND_CA, days) : NULL;
    int rc = ca ? 0 : edl_errf(err, errlen, EDL_EIO, "OpenSSL could not make a CA: %s",
                               ERR_reason_error_string(ERR_get_error()));
    if (!rc)
        rc = write_pem(dir, EDL_ETCD_TLS_CA, ca, NULL, err, errlen);
    if (!rc)
        rc = make_leaf(dir, "server", "127.0.0.1", KIND_SERVER, ca, ca_key, days, err, errlen);
    if (!rc)
        rc = make_leaf(dir, "client", "edl", KIND_CLIENT, ca, ca_key, days, err, errlen);
    X509_free(ca);
    EVP_PKEY_free(ca_key);
    return rc;
}
