/* options.c: the one place that knows how a program is told to reach etcd: the flags
 * (--etcd --cacert --cert --key --user --password-file, the names of etcd's own tools), the
 * environment variables that carry the same settings to children, how they are checked
 * (certificate with key, readable files made absolute, the password read from its file), and
 * what to advise when etcd cannot be reached or refuses the credentials. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edl/etcd.h"
#include "edl/proc.h"

#define PASSWORD_MAX 1024

/* Every setting: its flag, its environment variable, its string field (SIZE_MAX: the
 * endpoint list, which is no single string) and whether it names a file. */
static const struct setting {
    const char *flag, *env;
    size_t field;
    bool file;
} settings[] = {
    {"etcd", "EDL_ETCD_ENDPOINTS", SIZE_MAX, false},
    {"cacert", "EDL_ETCD_CACERT", offsetof(edl_etcd_config, ca_file), true},
    {"cert", "EDL_ETCD_CERT", offsetof(edl_etcd_config, cert_file), true},
    {"key", "EDL_ETCD_KEY", offsetof(edl_etcd_config, key_file), true},
    {"user", "EDL_ETCD_USER", offsetof(edl_etcd_config, username), false},
    {"password-file", "EDL_ETCD_PASSWORD_FILE", offsetof(edl_etcd_config, password_file), true},
};
#define N_SETTINGS (sizeof settings / sizeof settings[0])

static char **field(edl_etcd_config *cfg, const struct setting *s)
{
    return (char **)((char *)cfg + s->field);
}

static bool is_set(const edl_etcd_config *cfg, const struct setting *s)
{
    if (s->field == SIZE_MAX)
        return cfg->n_endpoints > 0;
    return *field((edl_etcd_config *)cfg, s) != NULL;
}

static int set_one(edl_etcd_config *cfg, const struct setting *s, const char *value, char *err,
                   size_t errlen)
{
    if (s->field == SIZE_MAX) {
        int rc = edl_etcd_config_set_endpoints(cfg, value);
        return rc ? edl_errf(err, errlen, rc, "--etcd / EDL_ETCD_ENDPOINTS '%s': expected "
                             "http(s)://host:port, comma-separated", value) : 0;
    }
    char *copy = strdup(value);
    if (!copy)
        return edl_errf(err, errlen, EDL_ENOMEM, "out of memory");
    free(*field(cfg, s));
    *field(cfg, s) = copy;
    return 0;
}

int edl_etcd_config_set_option(edl_etcd_config *cfg, const char *flag, const char *value,
                               char *err, size_t errlen)
{
    if (flag && strncmp(flag, "--", 2) == 0)
        flag += 2;
    for (size_t i = 0; flag && value && i < N_SETTINGS; i++)
        if (strcmp(flag, settings[i].flag) == 0)
            return set_one(cfg, &settings[i], value, err, errlen);
    return edl_errf(err, errlen, EDL_EINVAL, "unknown etcd option '%s'", flag ? flag : "(null)");
}

int edl_etcd_config_from_entries(edl_etcd_config *cfg, char *const *entries, char *err,
                                 size_t errlen)
{
    for (size_t i = 0; i < N_SETTINGS; i++) {
        size_t n = strlen(settings[i].env);
        const char *v = NULL;
        for (char *const *e = entries; e && *e && !v; e++)
            if (strncmp(*e, settings[i].env, n) == 0 && (*e)[n] == '=')
                v = *e + n + 1;
        if (!v || !*v || is_set(cfg, &settings[i]))
            continue;
        int rc = set_one(cfg, &settings[i], v, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int edl_etcd_config_from_env(edl_etcd_config *cfg, char *err, size_t errlen)
{
    return edl_etcd_config_from_entries(cfg, environ, err, errlen);
}

/* Replace a file setting by its absolute path, after checking that it can be read. */
static int check_file(edl_etcd_config *cfg, const struct setting *s, char *err, size_t errlen)
{
    char **f = field(cfg, s), abs[PATH_MAX];
    if (!*f)
        return 0;
    if (!realpath(*f, abs) || access(abs, R_OK) != 0)
        return edl_errf(err, errlen, EDL_EINVAL, "--%s / %s '%s': %s", s->flag, s->env, *f,
                        strerror(errno));
    char *copy = strdup(abs);
    if (!copy)
        return edl_errf(err, errlen, EDL_ENOMEM, "out of memory");
    free(*f);
    *f = copy;
    return 0;
}

/* The password: the file's one line, without its newline. */
static int read_password(edl_etcd_config *cfg, char *err, size_t errlen)
{
    char buf[PASSWORD_MAX + 2];
    int fd = open(cfg->password_file, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (n < 0)
        return edl_errf(err, errlen, EDL_EINVAL, "--password-file '%s': %s", cfg->password_file,
                        strerror(e));
    buf[n] = '\0';
    size_t len = strcspn(buf, "\r\n");
    bool one_line = buf[len] == '\0' || strspn(buf + len, "\r\n") == (size_t)n - len;
    if (n > PASSWORD_MAX || len == 0 || !one_line || memchr(buf, '\0', (size_t)n))
        return edl_errf(err, errlen, EDL_EINVAL, "--password-file '%s': %s", cfg->password_file,
                        n > PASSWORD_MAX ? "longer than 1 KiB" : len == 0 ? "empty: the password "
                        "is the file's first line" : "the password must be the file's only line");
    char *pw = strndup(buf, len);
    explicit_bzero(buf, sizeof buf);
    if (!pw)
        return edl_errf(err, errlen, EDL_ENOMEM, "out of memory");
    if (cfg->password)
        explicit_bzero(cfg->password, strlen(cfg->password));
    free(cfg->password);
    cfg->password = pw;
    return 0;
}

int edl_etcd_config_check(edl_etcd_config *cfg, char *err, size_t errlen)
{
    if (!cfg->cert_file != !cfg->key_file)
        return edl_errf(err, errlen, EDL_EINVAL, "%s: a TLS client certificate needs its key "
                        "(--cert with --key, or EDL_ETCD_CERT with EDL_ETCD_KEY)",
                        cfg->cert_file ? "--cert without --key" : "--key without --cert");
    if (cfg->username && !cfg->password && !cfg->password_file)
        return edl_errf(err, errlen, EDL_EINVAL, "etcd user '%s' has no password: give "
                        "--password-file FILE (or EDL_ETCD_PASSWORD_FILE)", cfg->username);
    if (!cfg->username && (cfg->password || cfg->password_file))
        return edl_errf(err, errlen, EDL_EINVAL, "a password for no user: give --user NAME "
                        "(or EDL_ETCD_USER) with --password-file");
    int rc = 0;
    for (size_t i = 0; !rc && i < N_SETTINGS; i++)
        if (settings[i].file)
            rc = check_file(cfg, &settings[i], err, errlen);
    if (!rc && cfg->password_file)
        rc = read_password(cfg, err, errlen);
    return rc;
}

char *edl_etcd_config_endpoints(const edl_etcd_config *cfg)
{
    size_t len = 1;
    for (size_t i = 0; i < cfg->n_endpoints; i++)
        len += strlen(cfg->endpoints[i]) + 1;
    char *s = malloc(len);
    if (!s)
        return NULL;
    s[0] = '\0';
    for (size_t i = 0; i < cfg->n_endpoints; i++) {
        if (i)
            strcat(s, ",");
        strcat(s, cfg->endpoints[i]);
    }
    return s;
}

/* "EDL_ETCD_ENDPOINTS=a,b" (malloc'ed). */
static char *endpoints_entry(const edl_etcd_config *cfg)
{
    char *list = edl_etcd_config_endpoints(cfg), *s = NULL;
    size_t len = list ? strlen("EDL_ETCD_ENDPOINTS=") + strlen(list) + 1 : 0;
    if (list && (s = malloc(len)))
        snprintf(s, len, "EDL_ETCD_ENDPOINTS=%s", list);
    free(list);
    return s;
}

int edl_etcd_config_env(const edl_etcd_config *cfg, char ***out)
{
    char **env = calloc(N_SETTINGS + 1, sizeof *env);
    size_t n = 0;
    bool oom = !env;
    for (size_t i = 0; !oom && i < N_SETTINGS; i++) {
        const struct setting *s = &settings[i];
        if (!is_set(cfg, s))
            continue;
        if (s->field == SIZE_MAX)
            env[n] = endpoints_entry(cfg);
        else if (asprintf(&env[n], "%s=%s", s->env, *field((edl_etcd_config *)cfg, s)) < 0)
            env[n] = NULL;
        oom = !env[n++];
    }
    if (oom) {
        edl_env_free(env);
        return EDL_ENOMEM;
    }
    *out = env;
    return 0;
}

int edl_etcd_open_env(edl_etcd **out, char *err, size_t errlen)
{
    *out = NULL;
    edl_etcd_config cfg;
    edl_etcd_config_init(&cfg);
    int rc = edl_etcd_config_from_env(&cfg, err, errlen);
    if (!rc && cfg.n_endpoints == 0)
        rc = edl_errf(err, errlen, EDL_ENOTFOUND, "EDL_ETCD_ENDPOINTS is not set");
    if (!rc)
        rc = edl_etcd_config_check(&cfg, err, errlen);
    if (!rc && (rc = edl_etcd_open(&cfg, out)) != 0)
        edl_errf(err, errlen, rc, "cannot use etcd at EDL_ETCD_ENDPOINTS: %s", edl_strerror(rc));
    edl_etcd_config_clear(&cfg);
    return rc;
}

const char *edl_etcd_advice(int rc)
{
    switch (rc) {
    case EDL_EAUTH:
        return "etcd refused our credentials: check --cacert, --cert and --key (TLS), --user and "
               "--password-file (or EDL_ETCD_CACERT, EDL_ETCD_CERT, EDL_ETCD_KEY, EDL_ETCD_USER, "
               "EDL_ETCD_PASSWORD_FILE)";
    case EDL_EUNAVAIL:
    case EDL_ETIMEDOUT:
        return "check --etcd (EDL_ETCD_ENDPOINTS), that etcd runs and, for https, --cacert, "
               "--cert and --key";
    }
    return "";
}
