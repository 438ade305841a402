/* distill/wire.h: libedldistill's internal view of the wire forms (distill/wire.c): the
 * binary head's layout, shared by the encoder, the decoder and the fuzz target. The public
 * calls are edl_distill_encode and edl_distill_decode (edl/distill.h). */
#ifndef EDL_DISTILL_WIRE_H
#define EDL_DISTILL_WIRE_H

#include <stdint.h>

#include "edl/distill.h"

#define DISTILL_MAGIC "EDLT"
#define DISTILL_VERSION 1u
#define DISTILL_HEAD 16u        /* magic, version, rows, cols: 4 bytes each, little-endian */
#define DISTILL_NUMBER_MAX 64u  /* characters of one JSON number */

/* The JSON member that holds the tensor: "predictions" in a reply, "instances" in a request. */
static inline const char *distill_json_key(bool reply)
{
    return reply ? "predictions" : "instances";
}

#endif
