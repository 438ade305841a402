/* secret.h: the per-job secret that authenticates the links between a job's processes (the
 * collective mesh today, the parameter server's links later). It never travels through etcd:
 * every process reads it from a file (EDL_JOB_SECRET_FILE; on Kubernetes a Secret mounted with
 * defaultMode 0400) or, for tests and debugging, from EDL_JOB_SECRET. `edl run` generates one
 * per run (edl_job_secret_generate) in its private state directory. */
#ifndef EDL_SECRET_H
#define EDL_SECRET_H

#include <stddef.h>
#include <stdint.h>

#include "edl/common.h"

#define EDL_SECRET_FILE_ENV "EDL_JOB_SECRET_FILE"
#define EDL_SECRET_ENV "EDL_JOB_SECRET"
#define EDL_SECRET_MIN_BYTES 32   /* 256 bits */
#define EDL_SECRET_MAX_BYTES 1024
#define EDL_SECRET_MAC_BYTES 32   /* HMAC-SHA256 */

/* Caller-owned: edl_job_secret_init() ... edl_job_secret_clear() (which wipes the key). */
typedef struct edl_job_secret {
    uint8_t key[EDL_SECRET_MAX_BYTES];
    size_t len;          /* 0: no secret */
    char source[320];    /* where it came from, for messages: "file /path" or "EDL_JOB_SECRET" */
} edl_job_secret;

void edl_job_secret_init(edl_job_secret *s);
void edl_job_secret_clear(edl_job_secret *s);

/* Load the job's secret from the environment: EDL_JOB_SECRET_FILE (a path), else
 * EDL_JOB_SECRET (the value itself; visible in /proc/<pid>/environ to this user, so for tests).
 * 0 on success; EDL_ENOTFOUND when neither is set (empty counts as unset); EDL_ECONFIG, with
 * the reason in why, when both are set or the secret is unusable. s is untouched on error. */
int edl_job_secret_load(edl_job_secret *s, char *why, size_t whylen);
/* Load from a file: a regular file (links are followed: Kubernetes mounts Secrets through
 * them) with no access for group or others, holding EDL_SECRET_MIN_BYTES to
 * EDL_SECRET_MAX_BYTES bytes, used as they are. EDL_ECONFIG (why) otherwise. */
int edl_job_secret_load_file(edl_job_secret *s, const char *path, char *why, size_t whylen);

/* Write a fresh secret of 32 random bytes (getrandom) to a new file at path, mode 0600; the
 * file must not exist (O_EXCL, links not followed). 0, or EDL_EIO with the reason in why. */
int edl_job_secret_generate(const char *path, char *why, size_t whylen);

/* HMAC-SHA256 of msg under the secret into out. 0, EDL_EINVAL without a secret. */
int edl_job_secret_mac(const edl_job_secret *s, const void *msg, size_t len,
                       uint8_t out[EDL_SECRET_MAC_BYTES]);
/* The MAC that binds a link's frame to the job: HMAC-SHA256 of tag, kind (the frame's
 * direction or purpose), the job id's length (4 bytes, little-endian) and the job id, then the
 * link's transcript (what both ends said: their hellos, their nonces). EDL_EINVAL without a
 * secret or when it all passes 1 KiB. Every authenticated link of a job uses it. */
int edl_job_secret_link_mac(const edl_job_secret *s, const char *tag, uint8_t kind,
                            const char *job, const void *transcript, size_t len,
                            uint8_t out[EDL_SECRET_MAC_BYTES]);
/* Constant-time comparison of two MACs: true when equal. */
bool edl_job_secret_mac_equal(const uint8_t a[EDL_SECRET_MAC_BYTES],
                              const uint8_t b[EDL_SECRET_MAC_BYTES]);

#endif
