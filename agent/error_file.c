/* error_file.c: TORCHELASTIC_ERROR_FILE, where a failing trainer leaves its error (torch's
 * `@record` writes the exception there, as JSON), and reading it back for the pod's status.
 * It lives in a private directory of the agent's, in --scratch-dir (edl run gives one per run
 * and removes it, with what killed agents left, at its end), else in $TMPDIR or /tmp. */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "edl/log.h"

#define ERROR_FILE_MAX (64 * 1024) /* read at most this much of it */

int agent_error_file_open(agent *a)
{
    const char *tmp = a->o->scratch_dir ? a->o->scratch_dir : getenv("TMPDIR");
    snprintf(a->error_dir, sizeof a->error_dir, "%s/edl-agent-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(a->error_dir)) { /* 0700: nobody else reads or plants the trainer's error */
        EDL_WARN("agent", "cannot create %s for TORCHELASTIC_ERROR_FILE: trainers get none",
                 a->error_dir);
        a->error_dir[0] = '\0';
        return EDL_EIO;
    }
    snprintf(a->error_file, sizeof a->error_file, "%s/error.json", a->error_dir);
    return 0;
}

void agent_error_file_close(agent *a)
{
    if (!a->error_dir[0])
        return;
    unlink(a->error_file);
    rmdir(a->error_dir);
    a->error_dir[0] = a->error_file[0] = '\0';
}

/* torch writes {"message": {"message": "...", "extraInfo": {...}}}; older versions and other
 * writers a plain {"message": "..."}. Anything else: the text itself. edl.torch adds
 * "edl_own_error": true for an exception of the script's own (no communication failure). */
static const char *message_of(const cJSON *root)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "message");
    if (cJSON_IsString(m))
        return m->valuestring;
    m = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "message") : NULL;
    return cJSON_IsString(m) ? m->valuestring : NULL;
}

int agent_error_message(const char *buf, size_t n, char *out, size_t len, bool *own)
{
    cJSON *root = cJSON_ParseWithLength(buf, n);
    const char *msg = root ? message_of(root) : NULL;
    if (own)
        *own = msg && *msg && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "edl_own_error"));
    snprintf(out, len, "%s", msg ? msg : buf);
    cJSON_Delete(root);
    for (char *p = out; *p; p++) /* one line in logs, statuses and tables */
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = ' ';
    return out[0] ? 0 : EDL_ENOTFOUND;
}

int agent_read_error_file(const char *path, char *out, size_t len, bool *own)
{
    if (own)
        *own = false;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return EDL_ENOTFOUND;
    char *buf = malloc(ERROR_FILE_MAX + 1);
    ssize_t n = buf ? read(fd, buf, ERROR_FILE_MAX) : -1;
    close(fd);
    if (n <= 0) {
        free(buf);
        return EDL_ENOTFOUND;
    }
    buf[n] = '\0';
    int rc = agent_error_message(buf, (size_t)n, out, len, own);
    free(buf);
    return rc;
}
