/* manifest.c: `edl run -f job.yaml`: the TrainingJob manifest a cluster would run, read for a
 * run on this machine. The file's first TrainingJob is read with the operator's reader
 * (edl/trainingjob.h); every problem is printed as FILE:LINE: FIELD: what, a field the CRD does
 * not have is refused as the API server refuses it (a typo would otherwise run with a default),
 * and every field that only a cluster can honour (image, resources, volumes, ...) is named as
 * ignored, so that what runs here is never a silent approximation of the manifest.
 *
 * The trainer's command is the first container's command and args (spec.ps's parameter servers
 * and spec.teachers's teachers run the same command here: their templates may not ask for
 * another; the teachers' service, model and capacity apply). A bare name is looked up
 * as the container would (PATH); when it is not there, beside the `edl` binary and in the
 * examples folder of its build tree (build/bin/edl -> build/examples/), so that a manifest
 * written for an image with the trainer on its PATH runs unchanged from a build tree. A
 * file:// checkpoint URI on a volume the container mounts is moved to this user's directory
 * for the volume (see "volumes" below). */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "edl/proc.h"
#include "edl/yaml.h"

typedef struct reporter {
    const edl_yaml *y;
    size_t doc;
} reporter;

static void report_ignored(void *arg, const char *field)
{
    const reporter *r = arg;
    fprintf(stderr, "edl run: %s:%d: ignoring %s (only meaningful on a cluster)\n",
            edl_yaml_name(r->y), edl_yaml_line(r->y, r->doc, field), field);
}

static int field_error(const edl_yaml *y, size_t doc, const char *field, const char *err)
{
    fprintf(stderr, "edl run: %s:%d: %s%s%s\n", edl_yaml_name(y), edl_yaml_line(y, doc, field),
            field, *field ? ": " : "", err);
    return EDL_EXIT_USAGE;
}

/* The first TrainingJob of the file (others, and documents of other kinds, are named). */
static int pick_document(const edl_yaml *y, size_t *doc)
{
    bool found = false;
    for (size_t i = 0; i < edl_yaml_count(y); i++) {
        const cJSON *d = edl_yaml_doc(y, i);
        if (cJSON_IsNull(d))
            continue; /* an empty document ("---" at the end) */
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(d, "kind");
        const char *k = cJSON_IsString(kind) ? kind->valuestring : NULL;
        if (k && strcmp(k, EDL_TJ_KIND) == 0 && !found) {
            found = true;
            *doc = i;
        } else {
            fprintf(stderr, "edl run: %s:%d: skipping a document of kind %s%s\n",
                    edl_yaml_name(y), edl_yaml_line(y, i, ""), k ? k : "(none)",
                    found ? " (edl run runs the first TrainingJob only)" : "");
        }
    }
    if (!found)
        fprintf(stderr, "edl run: %s: no TrainingJob in it (a document with apiVersion: "
                EDL_TJ_API_VERSION " and kind: " EDL_TJ_KIND ")\n", edl_yaml_name(y));
    return found ? 0 : EDL_EXIT_USAGE;
}

static const cJSON *first_container(const cJSON *tmpl)
{
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(tmpl, "spec");
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(spec, "containers"), 0);
}

/* spec.ps and spec.teachers: edl run starts its parameter servers and teachers as agents with
 * --role ps / --role teacher running the workers' command in the workers' environment (the
 * program tells its role by TRAINING_ROLE or EDL_ROLE_NAME), so a template of theirs with
 * another command cannot run here (refused), and its own env or workingDir is named as
 * ignored. pre: "spec.ps" or "spec.teachers"; who: "parameter servers" or "teachers". Called
 * before the command is resolved. */
static int check_role_template(const edl_yaml *y, size_t doc, const edl_trainingjob *tj,
                               const cJSON *tmpl, char *const *command, size_t n_command,
                               const char *pre, const char *who, const char *tells)
{
    if (!tmpl)
        return 0;
    char field[96];
    bool same = n_command == tj->n_command;
    for (size_t i = 0; same && i < tj->n_command; i++)
        same = strcmp(command[i], tj->command[i]) == 0;
    if (!same) {
        char err[512];
        snprintf(field, sizeof field, "%s.template.spec.containers[0].command", pre);
        snprintf(err, sizeof err, "differs from the workers' command and args: edl run starts "
                 "its %s with the workers' command (the program tells its role by %s); give "
                 "both templates the same command and args", who, tells);
        return field_error(y, doc, field, err);
    }
    static const char *const keys[] = {"env", "workingDir"};
    const cJSON *w = first_container(tj->pod_template), *p = first_container(tmpl);
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(w, keys[i]);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(p, keys[i]);
        if (b && !cJSON_Compare(a, b, true)) {
            snprintf(field, sizeof field, "%s.template.spec.containers[0].%s", pre, keys[i]);
            fprintf(stderr, "edl run: %s:%d: ignoring %s: the %s get the workers' %s here\n",
                    edl_yaml_name(y), edl_yaml_line(y, doc, field), field, who, keys[i]);
        }
    }
    return 0;
}

static int check_role_templates(const edl_yaml *y, size_t doc, const edl_trainingjob *tj)
{
    int rc = check_role_template(y, doc, tj, tj->ps_template, tj->ps_command, tj->n_ps_command,
                                 "spec.ps", "parameter servers", "TRAINING_ROLE");
    return rc ? rc : check_role_template(y, doc, tj, tj->teacher_template, tj->teacher_command,
                                         tj->n_teacher_command, "spec.teachers", "teachers",
                                         "EDL_ROLE_NAME");
}

/* The container's env entries with a plain value, as NAME=value. */
static int read_env(const edl_trainingjob *tj, cli_manifest *m)
{
    const cJSON *ctr = first_container(tj->pod_template);
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(ctr, "env");
    const cJSON *wd = cJSON_GetObjectItemCaseSensitive(ctr, "workingDir");
    if (cJSON_IsString(wd) && *wd->valuestring && !(m->working_dir = strdup(wd->valuestring)))
        return EDL_ENOMEM;
    size_t n = 0;
    m->env = calloc((size_t)cJSON_GetArraySize(env) + 1, sizeof *m->env);
    if (!m->env)
        return EDL_ENOMEM;
    for (const cJSON *e = cJSON_IsArray(env) ? env->child : NULL; e; e = e->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *value = cJSON_GetObjectItemCaseSensitive(e, "value");
        if (cJSON_GetObjectItemCaseSensitive(e, "valueFrom") || !cJSON_IsString(name))
            continue; /* reported as cluster-only */
        if (asprintf(&m->env[n], "%s=%s", name->valuestring,
                     cJSON_IsString(value) ? value->valuestring : "") < 0) {
            m->env[n] = NULL;
            return EDL_ENOMEM;
        }
        n++;
    }
    return 0;
}

/* A bare command not on PATH: beside this program, or in its build tree's examples folder.
 * Returns the path found (malloc'ed) or NULL. */
static char *find_beside_edl(const char *name)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return NULL;
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    static const char *const dirs[] = {"", "/../examples"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        char cand[PATH_MAX + 64], real[PATH_MAX];
        snprintf(cand, sizeof cand, "%s%s/%s", self, dirs[i], name);
        if (access(cand, X_OK) == 0 && realpath(cand, real))
            return strdup(real);
    }
    return NULL;
}

static int resolve_trainer(const edl_yaml *y, size_t doc, edl_trainingjob *tj)
{
    const char *field = "spec.template.spec.containers[0].command[0]";
    char *cmd = tj->command[0];
    if (strchr(cmd, '/'))
        return 0; /* a path: resolved by the agent, from the working directory */
    char *found = edl_spawn_resolve(cmd);
    if (found) {
        free(found);
        return 0;
    }
    if (!(found = find_beside_edl(cmd))) {
        char err[PATH_MAX + 128];
        snprintf(err, sizeof err, "\"%s\" is not on PATH, nor beside edl; put the trainer on "
                 "PATH or give its path", cmd);
        return field_error(y, doc, field, err);
    }
    fprintf(stderr, "edl run: %s:%d: %s: \"%s\" is not on PATH; using %s\n", edl_yaml_name(y),
            edl_yaml_line(y, doc, field), field, cmd, found);
    free(cmd);
    tj->command[0] = found;
    return 0;
}

/* ---- volumes ------------------------------------------------------------------------------
 * A volume the first container mounts is the job's own on a cluster (the examples' shared claim
 * at /tmp/edl-examples); here its mount path would be a directory every user of the host
 * shares, and writes. So a file:// checkpoint URI under a mount path becomes, here, this user's
 * directory for the volume, ${TMPDIR:-/tmp}/edl-volumes-<uid>/<claim, else volume name>: kept
 * between runs like a claim (a job resumes from its checkpoints), private to the user. */

/* The volumeMount whose mountPath holds path (the longest), or NULL; *len: its length. */
static const cJSON *mount_of(const cJSON *ctr, const char *path, size_t *len)
{
    const cJSON *mounts = cJSON_GetObjectItemCaseSensitive(ctr, "volumeMounts"), *best = NULL;
    *len = 0;
    for (const cJSON *v = cJSON_IsArray(mounts) ? mounts->child : NULL; v; v = v->next) {
        const cJSON *mp = cJSON_GetObjectItemCaseSensitive(v, "mountPath");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name");
        if (!cJSON_IsString(mp) || !cJSON_IsString(name) || !edl_name_valid(name->valuestring))
            continue;
        size_t n = strlen(mp->valuestring);
        while (n > 1 && mp->valuestring[n - 1] == '/')
            n--;
        if (n > *len && strncmp(path, mp->valuestring, n) == 0 &&
            (path[n] == '/' || path[n] == '\0')) {
            best = v;
            *len = n;
        }
    }
    return best;
}

/* What names the volume's data: its persistentVolumeClaim's claimName, else its name. */
static const char *volume_name(const cJSON *tmpl, const char *name)
{
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(tmpl, "spec");
    const cJSON *vols = cJSON_GetObjectItemCaseSensitive(spec, "volumes");
    for (const cJSON *v = cJSON_IsArray(vols) ? vols->child : NULL; v; v = v->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(v, "name");
        const cJSON *pvc = cJSON_GetObjectItemCaseSensitive(v, "persistentVolumeClaim");
        const cJSON *claim = cJSON_GetObjectItemCaseSensitive(pvc, "claimName");
        if (cJSON_IsString(n) && strcmp(n->valuestring, name) == 0 && cJSON_IsString(claim) &&
            edl_name_valid(claim->valuestring))
            return claim->valuestring;
    }
    return name;
}

/* This user's directory for a volume, made 0700 (and checked) if missing: 0 or an exit code. */
static int volume_dir(const char *volume, char *out, size_t n)
{
    const char *tmp = getenv("TMPDIR");
    char base[PATH_MAX / 2], why[PATH_MAX + 200];
    snprintf(base, sizeof base, "%s/edl-volumes-%u", tmp && *tmp ? tmp : "/tmp",
             (unsigned)getuid());
    if ((size_t)snprintf(out, n, "%s/%s", base, volume) >= n)
        snprintf(why, sizeof why, "%s/%s: too long", base, volume);
    else if (cli_private_dir(base, true, why, sizeof why) == 0 &&
        cli_private_dir(out, true, why, sizeof why) == 0)
        return 0;
    fprintf(stderr, "edl run: the directory for the manifest's volume %s: %s\n", volume, why);
    return EDL_EXIT_USAGE;
}

static int map_volumes(const edl_yaml *y, size_t doc, edl_trainingjob *tj)
{
    const char *field = "spec.checkpoint.uri", *uri = tj->spec.checkpoint_uri;
    size_t len;
    const cJSON *mount = uri && strncmp(uri, "file://", 7) == 0 ?
                         mount_of(first_container(tj->pod_template), uri + 7, &len) : NULL;
    if (!mount)
        return 0;
    const char *name = cJSON_GetObjectItemCaseSensitive(mount, "name")->valuestring;
    const char *volume = volume_name(tj->pod_template, name);
    char dir[PATH_MAX], *mapped = NULL;
    int rc = volume_dir(volume, dir, sizeof dir);
    if (rc)
        return rc;
    if (asprintf(&mapped, "file://%s%s", dir, uri + 7 + len) < 0)
        return EDL_EXIT_USAGE;
    fprintf(stderr, "edl run: %s:%d: %s: %s is on the volume %s (%s, mounted at %.*s); here "
            "that is this user's %s\n", edl_yaml_name(y), edl_yaml_line(y, doc, field), field,
            uri, name, volume == name ? "no claim" : volume, (int)len, uri + 7, mapped);
    free(tj->spec.checkpoint_uri);
    tj->spec.checkpoint_uri = mapped;
    return 0;
}

int cli_manifest_load(const char *path, bool use_checkpoint, cli_manifest *m)
{
    memset(m, 0, sizeof *m);
    edl_yaml *y = NULL;
    char err[1024], field[256];
    int rc = edl_yaml_load_file(path, &y, err, sizeof err);
    if (rc) {
        fprintf(stderr, "edl run: %s\n", err);
        return EDL_EXIT_USAGE;
    }
    size_t doc = 0;
    rc = pick_document(y, &doc);
    /* first, as the API server decodes strictly before it validates */
    if (!rc && edl_trainingjob_unknown_field(edl_yaml_doc(y, doc), field, sizeof field, err,
                                             sizeof err) != 0)
        rc = field_error(y, doc, field, err);
    if (!rc && edl_trainingjob_parse(edl_yaml_doc(y, doc), &m->tj, field, sizeof field, err,
                                     sizeof err) != 0)
        rc = field_error(y, doc, field, err);
    if (!rc && m->tj.suspend)
        rc = field_error(y, doc, "spec.suspend", "is true: a suspended job runs no pods; set it "
                         "to false to run the job");
    if (!rc) {
        reporter r = {y, doc};
        edl_trainingjob_cluster_only(edl_yaml_doc(y, doc), report_ignored, &r);
        rc = check_role_templates(y, doc, &m->tj);
    }
    if (!rc)
        rc = resolve_trainer(y, doc, &m->tj);
    if (!rc && use_checkpoint)
        rc = map_volumes(y, doc, &m->tj);
    if (!rc && read_env(&m->tj, m) != 0) {
        fprintf(stderr, "edl run: %s: out of memory\n", path);
        rc = EDL_EXIT_USAGE;
    }
    if (!rc && m->tj.spec.replicas < m->tj.spec.min)
        fprintf(stderr, "edl run: %s:%d: spec.replicas (%d) is below minReplicas (%d): the job "
                "waits until `edl scale %s N` starts enough pods\n", path,
                edl_yaml_line(y, doc, "spec.replicas"), m->tj.spec.replicas, m->tj.spec.min,
                m->tj.name);
    edl_yaml_free(y);
    if (rc)
        cli_manifest_clear(m);
    return rc;
}

void cli_manifest_clear(cli_manifest *m)
{
    edl_trainingjob_clear(&m->tj);
    for (char **e = m->env; e && *e; e++)
        free(*e);
    free(m->env);
    free(m->working_dir);
    memset(m, 0, sizeof *m);
}
