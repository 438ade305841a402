/* consumer.c: a program outside edl's build that links the installed libedlcoll (and through
 * it libedletcd, libedljob and libedlcore) as a trainer would: it must compile against the
 * installed headers, link, and run. Outside a job (no EDL_ETCD_ENDPOINTS) the communicator is a
 * group of one, so an allreduce gives back what it was given. */
#include <stdio.h>

#include "edl/collective.h"
#include "edl/common.h"

int main(void)
{
    edl_comm *c = NULL;
    int rc = edl_coll_open(NULL, &c);
    if (rc) {
        fprintf(stderr, "edl_coll_open: %s\n", edl_strerror(rc));
        return 1;
    }
    float x[3] = {1, 2, 3}, sum[3] = {0};
    rc = edl_allreduce(c, x, sum, 3, EDL_FLOAT32, EDL_SUM);
    printf("rank %d of %d: allreduce %s, %g %g %g\n", edl_coll_rank(c), edl_coll_size(c),
           rc ? edl_strerror(rc) : "ok", sum[0], sum[1], sum[2]);
    edl_coll_close(c);
    return rc ? 1 : 0;
}
