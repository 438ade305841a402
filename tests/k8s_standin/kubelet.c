/* kubelet.c: stub */
#include "standin.h"
si_kubelet *si_kubelet_start(si_server *srv) { (void)srv; return NULL; }
void si_kubelet_stop(si_kubelet *k) { (void)k; }
char *si_kubelet_log(si_server *srv, const cJSON *pod, const char *container, size_t *len) { (void)srv; (void)pod; (void)container; (void)len; return NULL; }
