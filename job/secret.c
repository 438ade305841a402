/* secret.c: the per-job secret (edl/secret.h): loaded in this one place from a private file or
 * the environment, generated for `edl run`, and the HMAC-SHA256 that proves a process holds it
 * (OpenSSL's libcrypto), with the one layout of a link's MAC input that the collective mesh and
 * the parameter server share. The key is wiped when cleared. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edl/secret.h"
#include "edl/wire.h"

void edl_job_secret_init(edl_job_secret *s)
{
    memset(s, 0, sizeof *s);
}

void edl_job_secret_clear(edl_job_secret *s)
{
    OPENSSL_cleanse(s, sizeof *s);
}

static int set_key(edl_job_secret *s, const void *key, size_t len, const char *source)
{
    memcpy(s->key, key, len);
    s->len = len;
    snprintf(s->source, sizeof s->source, "%s", source);
    return 0;
}

int edl_job_secret_load_file(edl_job_secret *s, const char *path, char *why, size_t whylen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return edl_errf(why, whylen, EDL_ECONFIG, EDL_SECRET_FILE_ENV "=%s: cannot open it: %s",
                        path, strerror(errno));
    struct stat st;
    uint8_t buf[EDL_SECRET_MAX_BYTES + 1];
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = edl_errf(why, whylen, EDL_ECONFIG, EDL_SECRET_FILE_ENV "=%s is not a regular file",
                      path);
    else if (st.st_mode & 077)
        rc = edl_errf(why, whylen, EDL_ECONFIG, EDL_SECRET_FILE_ENV "=%s is readable or writable "
                      "by group or others (mode %03o): refused; chmod 600 it (on Kubernetes, "
                      "mount the Secret with defaultMode 0400)", path,
                      (unsigned)(st.st_mode & 0777));
    size_t got = 0;
    while (!rc && got < sizeof buf) {
        ssize_t n = read(fd, buf + got, sizeof buf - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = edl_errf(why, whylen, EDL_ECONFIG, EDL_SECRET_FILE_ENV "=%s: %s", path,
                          strerror(errno));
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (!rc && (got < EDL_SECRET_MIN_BYTES || got > EDL_SECRET_MAX_BYTES))
        rc = edl_errf(why, whylen, EDL_ECONFIG, EDL_SECRET_FILE_ENV "=%s holds %s%zu bytes; a job "
                      "secret is %d to %d bytes (e.g. head -c 32 /dev/urandom > FILE)", path,
                      got > EDL_SECRET_MAX_BYTES ? "more than " : "", got > EDL_SECRET_MAX_BYTES
                      ? (size_t)EDL_SECRET_MAX_BYTES : got, EDL_SECRET_MIN_BYTES,
                      EDL_SECRET_MAX_BYTES);
    char source[sizeof s->source];
    snprintf(source, sizeof source, "file %.300s", path);
    if (!rc)
        set_key(s, buf, got, source);
    OPENSSL_cleanse(buf, sizeof buf);
    return rc;
}

int edl_job_secret_load(edl_job_secret *s, char *why, size_t whylen)
{
    const char *path = getenv(EDL_SECRET_FILE_ENV), *val = getenv(EDL_SECRET_ENV);
    bool have_path = path && *path, have_val = val && *val;
    if (have_path && have_val)
        return edl_errf(why, whylen, EDL_ECONFIG, "both " EDL_SECRET_FILE_ENV " and "
                        EDL_SECRET_ENV " are set: set only one");
    if (have_path)
        return edl_job_secret_load_file(s, path, why, whylen);
    if (!have_val)
        return edl_errf(why, whylen, EDL_ENOTFOUND, "no job secret: set " EDL_SECRET_FILE_ENV
                        " to a private file of at least %d random bytes (edl run makes one)",
                        EDL_SECRET_MIN_BYTES);
    size_t len = strlen(val);
    if (len < EDL_SECRET_MIN_BYTES || len > EDL_SECRET_MAX_BYTES)
        return edl_errf(why, whylen, EDL_ECONFIG, EDL_SECRET_ENV " holds %zu bytes; a job secret "
                        "is %d to %d bytes", len, EDL_SECRET_MIN_BYTES, EDL_SECRET_MAX_BYTES);
    return set_key(s, val, len, EDL_SECRET_ENV);
}

int edl_job_secret_generate(const char *path, char *why, size_t whylen)
{
    uint8_t key[32];
    if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key)
        return edl_errf(why, whylen, EDL_EIO, "getrandom: %s", strerror(errno));
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        OPENSSL_cleanse(key, sizeof key);
        return edl_errf(why, whylen, EDL_EIO, "%s: %s", path, strerror(errno));
    }
    bool ok = write(fd, key, sizeof key) == (ssize_t)sizeof key;
    ok = close(fd) == 0 && ok;
    OPENSSL_cleanse(key, sizeof key);
    if (!ok) {
        unlink(path);
        return edl_errf(why, whylen, EDL_EIO, "%s: cannot write the secret", path);
    }
    return 0;
}

int edl_job_secret_mac(const edl_job_secret *s, const void *msg, size_t len,
                       uint8_t out[EDL_SECRET_MAC_BYTES])
{
    unsigned int outlen = 0;
    if (!s || !s->len ||
        !HMAC(EVP_sha256(), s->key, (int)s->len, msg, len, out, &outlen) ||
        outlen != EDL_SECRET_MAC_BYTES)
        return EDL_EINVAL;
    return 0;
}

int edl_job_secret_link_mac(const edl_job_secret *s, const char *tag, uint8_t kind,
                            const char *job, const void *transcript, size_t len,
                            uint8_t out[EDL_SECRET_MAC_BYTES])
{
    uint8_t msg[1024];
    size_t tl = strlen(tag), jl = strlen(job), n = 0;
    if (tl + 1 + 4 + jl + len > sizeof msg)
        return EDL_EINVAL;
    memcpy(msg, tag, tl);
    n += tl;
    msg[n++] = kind;
    edl_put32(msg + n, (uint32_t)jl);
    n += 4;
    memcpy(msg + n, job, jl);
    n += jl;
    memcpy(msg + n, transcript, len);
    return edl_job_secret_mac(s, msg, n + len, out);
}

bool edl_job_secret_mac_equal(const uint8_t a[EDL_SECRET_MAC_BYTES],
                              const uint8_t b[EDL_SECRET_MAC_BYTES])
{
    return CRYPTO_memcmp(a, b, EDL_SECRET_MAC_BYTES) == 0;
}
