/* kubelet_exec.c: stub */
#include "standin.h"
