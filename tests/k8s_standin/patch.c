/* patch.c: the patch formats of PATCH requests: JSON merge patch (RFC 7386), JSON patch
 * (RFC 6902, with RFC 6901 pointers), and an approximation of strategic merge patch for
 * built-in types (a merge patch whose `$` directives are dropped and whose lists of objects
 * that carry a `name` are merged by name; see README.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

static cJSON *merge(cJSON *target, const cJSON *patch, bool strategic);

static void put(cJSON *obj, const char *key, cJSON *v)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, key))
        cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v);
    else
        cJSON_AddItemToObject(obj, key, v);
}

/* Strategic merge of two lists of named objects: patch items replace-merge the item of the
 * same name, `$patch: delete` removes it, new names are appended. */
static cJSON *merge_named_list(cJSON *target, const cJSON *patch)
{
    const cJSON *p;
    cJSON_ArrayForEach(p, patch)
    {
        const char *name = si_str(p, "name");
        cJSON *t = NULL, *it;
        cJSON_ArrayForEach(it, target) if (name && si_str(it, "name") &&
                                           !strcmp(si_str(it, "name"), name)) t = it;
        const char *directive = si_str(p, "$patch");
        if (t && directive && !strcmp(directive, "delete")) {
            cJSON_Delete(cJSON_DetachItemViaPointer(target, t));
        } else if (t) {
            cJSON *copy = cJSON_Duplicate(t, true);
            copy = merge(copy, p, true);
            cJSON_ReplaceItemViaPointer(target, t, copy);
        } else if (!directive) {
            cJSON_AddItemToArray(target, merge(NULL, p, true));
        }
    }
    return target;
}

static bool named_objects(const cJSON *list)
{
    const cJSON *it;
    if (!cJSON_IsArray(list) || !list->child)
        return false;
    cJSON_ArrayForEach(it, list) if (!si_str(it, "name")) return false;
    return true;
}

/* RFC 7386, section 2; target is taken and the result returned. */
static cJSON *merge(cJSON *target, const cJSON *patch, bool strategic)
{
    if (strategic && cJSON_IsArray(patch) && named_objects(patch) && cJSON_IsArray(target))
        return merge_named_list(target, patch);
    if (!cJSON_IsObject(patch)) {
        cJSON_Delete(target);
        return cJSON_Duplicate(patch, true);
    }
    if (!cJSON_IsObject(target)) {
        cJSON_Delete(target);
        target = cJSON_CreateObject();
    }
    const cJSON *p;
    cJSON_ArrayForEach(p, patch)
    {
        if (strategic && p->string[0] == '$')
            continue;
        if (cJSON_IsNull(p)) {
            cJSON_DeleteItemFromObjectCaseSensitive(target, p->string);
            continue;
        }
        cJSON *cur = cJSON_DetachItemFromObjectCaseSensitive(target, p->string);
        cJSON_AddItemToObject(target, p->string, merge(cur, p, strategic));
    }
    return target;
}

int si_merge_patch(cJSON **target, const cJSON *patch)
{
    *target = merge(*target, patch, false);
    return *target ? 0 : -1;
}

int si_strategic_patch(cJSON **target, const cJSON *patch)
{
    *target = merge(*target, patch, true);
    return *target ? 0 : -1;
}

/* ---- RFC 6902 ---------------------------------------------------------------------------- */

/* Split an RFC 6901 pointer into its parent and last token (unescaped). */
static int split_pointer(const char *ptr, char *parent, size_t plen, char *last, size_t llen)
{
    if (ptr[0] != '/' && ptr[0] != '\0')
        return -1;
    const char *slash = strrchr(ptr, '/');
    if (!slash)
        return -1;
    if ((size_t)(slash - ptr) >= plen || strlen(slash + 1) >= llen)
        return -1;
    memcpy(parent, ptr, (size_t)(slash - ptr));
    parent[slash - ptr] = '\0';
    size_t k = 0;
    for (const char *s = slash + 1; *s; s++) {
        if (*s == '~' && (s[1] == '0' || s[1] == '1')) {
            last[k++] = s[1] == '0' ? '~' : '/';
            s++;
        } else {
            last[k++] = *s;
        }
    }
    last[k] = '\0';
    return 0;
}

static cJSON *resolve(cJSON *root, const char *ptr)
{
    if (!*ptr)
        return root;
    char parent[1024], last[512];
    if (split_pointer(ptr, parent, sizeof parent, last, sizeof last))
        return NULL;
    cJSON *c = resolve(root, parent);
    if (cJSON_IsObject(c))
        return cJSON_GetObjectItemCaseSensitive(c, last);
    if (cJSON_IsArray(c)) {
        char *end;
        long i = strtol(last, &end, 10);
        return *end || end == last ? NULL : cJSON_GetArrayItem(c, (int)i);
    }
    return NULL;
}

static int array_index(const char *tok, int size, bool allow_end)
{
    if (allow_end && !strcmp(tok, "-"))
        return size;
    char *end;
    long i = strtol(tok, &end, 10);
    if (end == tok || *end || i < 0 || i > size || (!allow_end && i == size))
        return -1;
    return (int)i;
}

/* Remove the value at ptr and return it (NULL when absent). */
static cJSON *detach(cJSON *root, const char *ptr)
{
    char parent[1024], last[512];
    if (!*ptr || split_pointer(ptr, parent, sizeof parent, last, sizeof last))
        return NULL;
    cJSON *c = resolve(root, parent);
    if (cJSON_IsObject(c))
        return cJSON_DetachItemFromObjectCaseSensitive(c, last);
    if (cJSON_IsArray(c)) {
        int i = array_index(last, cJSON_GetArraySize(c), false);
        return i < 0 ? NULL : cJSON_DetachItemFromArray(c, i);
    }
    return NULL;
}

/* Add value (taken) at ptr: replaces a member, inserts into an array. */
static int add_at(cJSON **root, const char *ptr, cJSON *value)
{
    char parent[1024], last[512];
    if (!*ptr) {
        cJSON_Delete(*root);
        *root = value;
        return 0;
    }
    cJSON *c = split_pointer(ptr, parent, sizeof parent, last, sizeof last) ? NULL
                                                                            : resolve(*root, parent);
    if (cJSON_IsObject(c)) {
        put(c, last, value);
        return 0;
    }
    if (cJSON_IsArray(c)) {
        int i = array_index(last, cJSON_GetArraySize(c), true);
        if (i >= 0) {
            if (i == cJSON_GetArraySize(c))
                cJSON_AddItemToArray(c, value);
            else
                cJSON_InsertItemInArray(c, i, value);
            return 0;
        }
    }
    cJSON_Delete(value);
    return -1;
}

static int apply_op(cJSON **root, const cJSON *op, char *err, size_t errlen)
{
    const char *name = si_str(op, "op"), *path = si_str(op, "path"), *from = si_str(op, "from");
    const cJSON *value = cJSON_GetObjectItemCaseSensitive(op, "value");
    if (!name || !path) {
        snprintf(err, errlen, "a JSON patch operation needs \"op\" and \"path\"");
        return -400;
    }
    int rc = 0;
    if (!strcmp(name, "add") && value) {
        rc = add_at(root, path, cJSON_Duplicate(value, true));
    } else if (!strcmp(name, "remove")) {
        cJSON *v = detach(*root, path);
        rc = v ? 0 : -1;
        cJSON_Delete(v);
    } else if (!strcmp(name, "replace") && value) {
        cJSON *v = *path ? detach(*root, path) : NULL;
        rc = (v || !*path) ? add_at(root, path, cJSON_Duplicate(value, true)) : -1;
        cJSON_Delete(v);
    } else if ((!strcmp(name, "move") || !strcmp(name, "copy")) && from) {
        cJSON *v = name[0] == 'm' ? detach(*root, from) : cJSON_Duplicate(resolve(*root, from), true);
        rc = v ? add_at(root, path, v) : -1;
    } else if (!strcmp(name, "test") && value) {
        rc = si_json_equal(resolve(*root, path), value) ? 0 : -1;
        if (rc) {
            snprintf(err, errlen, "testing value %s failed", path);
            return -422;
        }
    } else {
        snprintf(err, errlen, "unexpected JSON patch operation \"%s\" (or a missing value)", name);
        return -400;
    }
    if (rc)
        snprintf(err, errlen, "%s operation does not apply: doc is missing path: \"%s\"", name, path);
    return rc ? -422 : 0;
}

int si_json_patch(cJSON **target, const cJSON *ops, char *err, size_t errlen)
{
    if (!cJSON_IsArray(ops)) {
        snprintf(err, errlen, "a JSON patch must be an array of operations");
        return -400;
    }
    const cJSON *op;
    cJSON_ArrayForEach(op, ops)
    {
        int rc = apply_op(target, op, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}
