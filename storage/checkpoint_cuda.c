/* checkpoint_cuda.c: the CUDA calls of device shards: pin staging memory, copy device memory
 * into it asynchronously on a stream of the checkpoint's own, wait for the stream.
 *
 * The CUDA runtime is opened with dlopen at the first device shard, not linked: the same
 * libedlstorage runs on hosts without CUDA (the agent's image), where only a device shard fails,
 * with EDL_EUNAVAIL. Built without CUDA's headers (EDL_HAVE_CUDA_RUNTIME unset), a device shard
 * fails with EDL_ENOTSUP and pinning is a no-op. */
#define _GNU_SOURCE
#include "checkpoint_internal.h"

#include <stdio.h>

#ifndef EDL_HAVE_CUDA_RUNTIME

static int no_cuda(char *err, size_t errlen)
{
    return edl_errf(err, errlen, EDL_ENOTSUP, "a device shard needs CUDA, and this build of edl "
                    "has none (CUDA's headers were not found when it was built)");
}

int ckpt_cuda_copy_async(void **stream, void *dst, const void *src, size_t len, char *err,
                         size_t errlen)
{
    (void)stream, (void)dst, (void)src, (void)len;
    return no_cuda(err, errlen);
}

int ckpt_cuda_sync(void *stream, char *err, size_t errlen)
{
    (void)stream;
    return no_cuda(err, errlen);
}

void ckpt_cuda_stream_free(void *stream)
{
    (void)stream;
}

int ckpt_cuda_pin(void *mem, size_t len, char *err, size_t errlen)
{
    (void)mem, (void)len;
    return no_cuda(err, errlen);
}

void ckpt_cuda_unpin(void *mem)
{
    (void)mem;
}

#else

#include <cuda_runtime_api.h>
#include <dlfcn.h>

/* The runtime calls used here, resolved once. */
typedef struct cuda_api {
    cudaError_t (*get_device_count)(int *);
    cudaError_t (*pointer_attributes)(struct cudaPointerAttributes *, const void *);
    cudaError_t (*stream_create)(cudaStream_t *, unsigned int);
    cudaError_t (*stream_destroy)(cudaStream_t);
    cudaError_t (*stream_sync)(cudaStream_t);
    cudaError_t (*memcpy_async)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
    cudaError_t (*host_register)(void *, size_t, unsigned int);
    cudaError_t (*host_unregister)(void *);
    const char *(*error_string)(cudaError_t);
    char why[256]; /* why the runtime is unusable ("" when it is usable) */
} cuda_api;

static cuda_api api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void *open_runtime(void)
{
    const char *names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    return NULL;
}

#define RESOLVE(field, sym) (*(void **)&api.field = dlsym(h, sym)) != NULL

static void load_api(void)
{
    void *h = open_runtime();
    if (!h) {
        snprintf(api.why, sizeof api.why, "the CUDA runtime (libcudart.so) cannot be loaded: %s",
                 dlerror());
        return;
    }
    if (!(RESOLVE(get_device_count, "cudaGetDeviceCount") &&
          RESOLVE(pointer_attributes, "cudaPointerGetAttributes") &&
          RESOLVE(stream_create, "cudaStreamCreateWithFlags") &&
          RESOLVE(stream_destroy, "cudaStreamDestroy") &&
          RESOLVE(stream_sync, "cudaStreamSynchronize") &&
          RESOLVE(memcpy_async, "cudaMemcpyAsync") &&
          RESOLVE(host_register, "cudaHostRegister") &&
          RESOLVE(host_unregister, "cudaHostUnregister") &&
          RESOLVE(error_string, "cudaGetErrorString"))) {
        snprintf(api.why, sizeof api.why, "the CUDA runtime lacks a call edl needs");
        return;
    }
    int n = 0;
    cudaError_t e = api.get_device_count(&n);
    if (e != cudaSuccess || n == 0)
        snprintf(api.why, sizeof api.why, "no CUDA device: %s",
                 e != cudaSuccess ? api.error_string(e) : "the runtime sees none");
}

static int usable(char *err, size_t errlen)
{
    pthread_once(&api_once, load_api);
    return api.why[0] ? edl_errf(err, errlen, EDL_EUNAVAIL, "%s", api.why) : 0;
}

static int cuda_fail(cudaError_t e, const char *what, char *err, size_t errlen)
{
    return edl_errf(err, errlen, EDL_EIO, "%s: %s", what, api.error_string(e));
}

int ckpt_cuda_copy_async(void **stream, void *dst, const void *src, size_t len, char *err,
                         size_t errlen)
{
    int rc = usable(err, errlen);
    if (rc != 0)
        return rc;
    struct cudaPointerAttributes at;
    cudaError_t e = api.pointer_attributes(&at, src);
    if (e != cudaSuccess || at.type != cudaMemoryTypeDevice)
        return edl_errf(err, errlen, EDL_EINVAL, "a shard marked device is not CUDA device memory "
                        "(%s)", e != cudaSuccess ? api.error_string(e) : "host or managed memory");
    if (!*stream && (e = api.stream_create((cudaStream_t *)stream, cudaStreamNonBlocking)) != cudaSuccess)
        return cuda_fail(e, "cannot create the checkpoint's CUDA stream", err, errlen);
    e = api.memcpy_async(dst, src, len, cudaMemcpyDeviceToHost, (cudaStream_t)*stream);
    return e == cudaSuccess ? 0 : cuda_fail(e, "copying a device shard to staging", err, errlen);
}

int ckpt_cuda_sync(void *stream, char *err, size_t errlen)
{
    if (usable(err, errlen) != 0)
        return EDL_EUNAVAIL;
    cudaError_t e = api.stream_sync((cudaStream_t)stream);
    return e == cudaSuccess ? 0 : cuda_fail(e, "copying a device shard to staging", err, errlen);
}

void ckpt_cuda_stream_free(void *stream)
{
    if (stream && usable(NULL, 0) == 0)
        api.stream_destroy((cudaStream_t)stream);
}

int ckpt_cuda_pin(void *mem, size_t len, char *err, size_t errlen)
{
    int rc = usable(err, errlen);
    if (rc != 0)
        return rc;
    cudaError_t e = api.host_register(mem, len, cudaHostRegisterDefault);
    return e == cudaSuccess ? 0 : cuda_fail(e, "cannot pin checkpoint staging memory", err, errlen);
}

void ckpt_cuda_unpin(void *mem)
{
    if (usable(NULL, 0) == 0)
        api.host_unregister(mem);
}

#endif
