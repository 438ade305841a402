// allreduce_gloo.cc: Gloo's allreduce algorithms (float32 sum, in place) for bench/allreduce.
//
//   allreduce_gloo --rank R --size N --store DIR --sizes 1024,4096 [--budget 0.3]
//                  [--algos ring,ring_chunked,halving_doubling,bcube,new_ring,new_bcube]
//
// One process per rank, started by the orchestrator. The ranks meet through a Gloo FileStore
// in DIR and connect a full mesh over Gloo's TCP transport on 127.0.0.1. Every algorithm is
// timed at every size by allreduce_timing.h; the orchestrator keeps the best per size.
//   ring, ring_chunked, halving_doubling, bcube: the algorithm classes (gloo/allreduce_*.h),
//       built once per size (their buffers are registered then) and run() repeatedly;
//   new_ring, new_bcube: the newer gloo::allreduce() entry point (gloo/allreduce.h), which
//       takes its buffers on each call, as PyTorch's ProcessGroupGloo uses it.
// bcube runs with base 2 when N is a power of two and base N (a single all-to-all step)
// otherwise, since its steps assume N is a power of the base.
#include <sys/prctl.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gloo/allreduce.h"
#include "gloo/allreduce_bcube.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

#include "allreduce_timing.h"

namespace {

enum Tag : uint32_t { kTagData = 1, kTagMax = 2, kTagBarrier = 3 };

struct Bench {
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    std::unique_ptr<gloo::Algorithm> algo; // the class-based algorithm of the current size
    gloo::AllreduceOptions::Algorithm new_algo = gloo::AllreduceOptions::Algorithm::RING;
    float *buf = nullptr;
};

int run_class(void *p, size_t count)
{
    (void)count; // fixed when the algorithm object was built
    static_cast<Bench *>(p)->algo->run();
    return 0;
}

int run_new(void *p, size_t count)
{
    Bench *b = static_cast<Bench *>(p);
    gloo::AllreduceOptions o(b->ctx);
    o.setAlgorithm(b->new_algo);
    o.setOutput(b->buf, count);
    o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
        &gloo::sum<float>));
    o.setTag(kTagData);
    gloo::allreduce(o);
    return 0;
}

int max_i64(void *p, int64_t *v, int n)
{
    Bench *b = static_cast<Bench *>(p);
    gloo::AllreduceOptions o(b->ctx);
    o.setOutput(v, (size_t)n);
    o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
        &gloo::max<int64_t>));
    o.setTag(kTagMax);
    gloo::allreduce(o);
    return 0;
}

int barrier(void *p)
{
    gloo::BarrierOptions o(static_cast<Bench *>(p)->ctx);
    o.setTag(kTagBarrier);
    gloo::barrier(o);
    return 0;
}

std::unique_ptr<gloo::Algorithm> make_class(const std::string &name, Bench &b, size_t count)
{
    std::vector<float *> ptrs{b.buf};
    std::shared_ptr<gloo::Context> c = b.ctx;
    int n = (int)count;
    if (name == "ring")
        return std::unique_ptr<gloo::Algorithm>(new gloo::AllreduceRing<float>(c, ptrs, n));
    if (name == "ring_chunked")
        return std::unique_ptr<gloo::Algorithm>(new gloo::AllreduceRingChunked<float>(c, ptrs, n));
    if (name == "halving_doubling")
        return std::unique_ptr<gloo::Algorithm>(
            new gloo::AllreduceHalvingDoubling<float>(c, ptrs, n));
    if (name == "bcube")
        return std::unique_ptr<gloo::Algorithm>(new gloo::AllreduceBcube<float>(c, ptrs, n));
    return nullptr;
}

int usage(const char *why)
{
    std::fprintf(stderr, "allreduce_gloo: %s\nusage: allreduce_gloo --rank R --size N --store DIR "
                         "--sizes BYTES,... [--budget S] [--algos A,B,...]\n", why);
    return 2;
}

} // namespace

int main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int rank = -1, size = 0;
    const char *store = nullptr;
    std::string algos = "ring,ring_chunked,halving_doubling,bcube,new_ring,new_bcube";
    size_t sizes[AR_MAX_SIZES];
    int n_sizes = -1;
    double budget = 0.3;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i];
        if (k == "--rank")
            rank = std::atoi(argv[i + 1]);
        else if (k == "--size")
            size = std::atoi(argv[i + 1]);
        else if (k == "--store")
            store = argv[i + 1];
        else if (k == "--sizes")
            n_sizes = ar_parse_sizes(argv[i + 1], sizes, AR_MAX_SIZES);
        else if (k == "--budget")
            budget = std::atof(argv[i + 1]);
        else if (k == "--algos")
            algos = argv[i + 1];
        else
            return usage(("unknown option " + k).c_str());
    }
    if (rank < 0 || size < 1 || rank >= size || !store || n_sizes <= 0 || budget <= 0)
        return usage("missing or bad option");

    Bench b;
    size_t max = 0;
    for (int i = 0; i < n_sizes; i++)
        max = sizes[i] > max ? sizes[i] : max;
    b.buf = static_cast<float *>(ar_alloc_touched(max));
    if (!b.buf) {
        std::fprintf(stderr, "allreduce_gloo: cannot allocate %zu bytes\n", max);
        return 1;
    }
    try {
        gloo::transport::tcp::attr attr("127.0.0.1");
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::FileStore fs(store);
        bool pow2 = (size & (size - 1)) == 0;
        b.ctx = std::make_shared<gloo::rendezvous::Context>(rank, size, pow2 ? 2 : size);
        b.ctx->setTimeout(std::chrono::seconds(60));
        b.ctx->connectFullMesh(fs, dev);

        ar_driver d = {};
        d.ctx = &b;
        d.rank = rank;
        d.size = size;
        d.buf = b.buf;
        d.verify = 1;
        d.max_i64 = max_i64;
        d.barrier = barrier;
        size_t pos = 0;
        while (pos <= algos.size()) {
            size_t comma = algos.find(',', pos);
            std::string name = algos.substr(pos, comma == std::string::npos ? comma : comma - pos);
            pos = comma == std::string::npos ? algos.size() + 1 : comma + 1;
            bool is_new = name.rfind("new_", 0) == 0;
            if (is_new && name != "new_ring" && name != "new_bcube")
                return usage(("unknown algorithm " + name).c_str());
            b.new_algo = name == "new_bcube" ? gloo::AllreduceOptions::Algorithm::BCUBE
                                             : gloo::AllreduceOptions::Algorithm::RING;
            d.allreduce = is_new ? run_new : run_class;
            for (int i = 0; i < n_sizes; i++) {
                if (!is_new) {
                    b.algo = make_class(name, b, sizes[i] / sizeof(float));
                    if (!b.algo)
                        return usage(("unknown algorithm " + name).c_str());
                }
                if (ar_measure(&d, "gloo", name.c_str(), sizes[i], budget))
                    return 1;
                b.algo.reset();
            }
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "allreduce_gloo: rank %d: %s\n", rank, e.what());
        return 1;
    }
    std::free(b.buf);
    return 0;
}
