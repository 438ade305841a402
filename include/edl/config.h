/* edl/config.h: load a YAML configuration file into a typed C struct.
 *
 * The caller describes its struct with a table of field descriptors; the loader walks one YAML
 * mapping against that table and reports the first problem with file, line and the dotted path
 * of the field ("job.yaml:7:12: field 'etcd.timeout': expected a duration ...").
 *
 *     typedef struct { char *name; int64_t port; } web_cfg;
 *     static const edl_cfg_field web_fields[] = {
 *         {"name", EDL_CFG_STRING, offsetof(web_cfg, name), .required = true},
 *         {"port", EDL_CFG_INT, offsetof(web_cfg, port), .min = 1, .max = 65535},
 *         EDL_CFG_END,
 *     };
 *     web_cfg cfg = {.port = 8080};          (defaults are whatever is in the struct)
 *     rc = edl_config_load_file("web.yaml", web_fields, &cfg, err, sizeof err);
 *     ...
 *     edl_config_free(web_fields, &cfg);
 *
 * Ownership: every STRING (char *) and STRING_LIST (char **) the schema describes belongs to
 * the struct. On entry each must be NULL or allocated with malloc (strdup), never a literal.
 * A successful load frees the values it replaces; edl_config_free() frees them all and sets
 * them to NULL (counts to 0). On any error the struct is left exactly as it was.
 *
 * Values: a key with no value (null) is an error for scalars and lists, and means "all
 * defaults" for an OBJECT; numbers may be written where a string is wanted. A STRING_LIST is
 * stored NULL-terminated with its count; an empty list ([]) is stored as NULL, count 0.
 * Required fields: an OBJECT's required members are checked only when the object appears.
 * DOUBLE uses strtod, so the C locale's decimal point is expected.
 *
 * Deliberately not supported: aliases (*name) are rejected, so a document cannot expand past
 * its own size; input is capped at EDL_CONFIG_MAX_BYTES and nesting at EDL_CONFIG_MAX_DEPTH;
 * only one YAML document per file. */
#ifndef EDL_CONFIG_H
#define EDL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EDL_CONFIG_MAX_BYTES (4u * 1024 * 1024)
#define EDL_CONFIG_MAX_DEPTH 32

typedef enum edl_cfg_type {
    EDL_CFG_STRING,      /* char *: any scalar, copied */
    EDL_CFG_INT,         /* int64_t: 42, -7, 0x1f; bounded by min/max */
    EDL_CFG_BOOL,        /* bool: true/false, yes/no, on/off */
    EDL_CFG_DOUBLE,      /* double: any finite number strtod reads */
    EDL_CFG_DURATION_MS, /* int64_t milliseconds: 1500 (ms), 500ms, 1.5s, 2m, 1h, 1h30m */
    EDL_CFG_STRING_LIST, /* char ** (NULL-terminated) + size_t count at count_offset */
    EDL_CFG_OBJECT,      /* a struct embedded at offset, described by fields */
} edl_cfg_type;

typedef struct edl_cfg_field {
    const char *name;   /* key in the YAML mapping; NULL ends the table */
    edl_cfg_type type;
    size_t offset;      /* offsetof() the member, relative to the enclosing (sub)struct */
    int64_t min, max;   /* INT and DURATION_MS: inclusive bounds; both 0 = unbounded */
    const struct edl_cfg_field *fields; /* OBJECT: nested table, ended by EDL_CFG_END */
    size_t count_offset; /* STRING_LIST: offsetof() the size_t that holds the count */
    bool required;      /* must appear in the file; inside an OBJECT, only checked when the
                         * object itself appears (mark the object required to force both) */
    const char *help;   /* one line for edl_config_print_help() */
} edl_cfg_field;

#define EDL_CFG_END {NULL}

/* Read and decode a file. Returns 0; EDL_EIO if it cannot be read; EDL_ETOOBIG over
 * EDL_CONFIG_MAX_BYTES; EDL_ECONFIG for any YAML or schema error; EDL_ENOMEM; EDL_EINVAL for
 * NULL arguments. err (may be NULL) receives one line saying what is wrong and where. */
int edl_config_load_file(const char *path, const edl_cfg_field *schema, void *out, char *err, size_t errlen);
/* The same for text in memory (need not be NUL-terminated); source_name stands for the file
 * name in messages (NULL: "<string>"). */
int edl_config_load_string(const char *text, size_t len, const char *source_name, const edl_cfg_field *schema,
                           void *out, char *err, size_t errlen);
/* Free every string and list the schema describes and set them to NULL / 0. */
void edl_config_free(const edl_cfg_field *schema, void *out);
/* One line per field: dotted path, type, "required", help. For --help output. */
void edl_config_print_help(const edl_cfg_field *schema, FILE *fp);

#ifdef __cplusplus
}
#endif
#endif
