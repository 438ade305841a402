// allreduce_gloo.cc: Gloo's collectives (float32, sum where they reduce) for bench/allreduce.
//
//   allreduce_gloo --rank R --size N --store DIR --sizes 1024,4096 [--budget 0.3]
//                  [--collective allreduce|allgather|reduce_scatter] [--algos A,B,...]
//
// One process per rank, started by the orchestrator. The ranks meet through a Gloo FileStore
// in DIR and connect a full mesh over Gloo's TCP transport on 127.0.0.1. Every algorithm of the
// collective (all by default) is timed at every size by allreduce_timing.h; the orchestrator
// keeps the best per size. Class-based algorithms are built once per size (their buffers are
// registered then) and run() repeatedly; the newer entry points (new_*) take their buffers on
// each call, as PyTorch's ProcessGroupGloo uses them.
//   allreduce (in place): ring, ring_chunked, halving_doubling, bcube (gloo/allreduce_*.h);
//       new_ring, new_bcube (gloo::allreduce() of gloo/allreduce.h). bcube runs with base 2
//       when N is a power of two and base N (a single all-to-all step) otherwise, since its
//       steps assume N is a power of the base.
//   allgather: ring (AllgatherRing, gloo/allgather_ring.h); new_ring (gloo::allgather() of
//       gloo/allgather.h, a ring in two pipelined halves).
//   reduce_scatter: halving_doubling (ReduceScatterHalvingDoubling, gloo/reduce_scatter.h, the
//       only one Gloo has); it reduces in place and leaves rank r's part at the start of the
//       buffer, so that is where the result is checked.
#include <sys/prctl.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gloo/allgather.h"
#include "gloo/allgather_ring.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_bcube.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"
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
    ar_driver d = {};
};

int run_class(void *p, size_t count)
{
    (void)count; // fixed when the algorithm object was built
    static_cast<Bench *>(p)->algo->run();
    return 0;
}

int run_new_allreduce(void *p, size_t count)
{
    Bench *b = static_cast<Bench *>(p);
    gloo::AllreduceOptions o(b->ctx);
    o.setAlgorithm(b->new_algo);
    o.setOutput(b->d.recv, count);
    o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
        &gloo::sum<float>));
    o.setTag(kTagData);
    gloo::allreduce(o);
    return 0;
}

int run_new_allgather(void *p, size_t count)
{
    Bench *b = static_cast<Bench *>(p);
    gloo::AllgatherOptions o(b->ctx);
    o.setInput(b->d.send, count);
    o.setOutput(b->d.recv, count * (size_t)b->d.size);
    o.setTag(kTagData);
    gloo::allgather(o);
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

gloo::Algorithm *make_allreduce(const std::string &name, Bench &b, int count)
{
    std::vector<float *> ptrs{b.d.recv};
    std::shared_ptr<gloo::Context> c = b.ctx;
    if (name == "ring")
        return new gloo::AllreduceRing<float>(c, ptrs, count);
    if (name == "ring_chunked")
        return new gloo::AllreduceRingChunked<float>(c, ptrs, count);
    if (name == "halving_doubling")
        return new gloo::AllreduceHalvingDoubling<float>(c, ptrs, count);
    if (name == "bcube")
        return new gloo::AllreduceBcube<float>(c, ptrs, count);
    return nullptr;
}

// The class-based algorithm `name` of b.d.coll for `count` (ar_count()), or null.
std::unique_ptr<gloo::Algorithm> make_class(const std::string &name, Bench &b, size_t count)
{
    int k = (int)count, n = b.d.size;
    gloo::Algorithm *a = nullptr;
    if (b.d.coll == AR_ALLREDUCE)
        a = make_allreduce(name, b, k);
    else if (b.d.coll == AR_ALLGATHER && name == "ring")
        a = new gloo::AllgatherRing<float>(b.ctx, {b.d.send}, b.d.recv, k);
    else if (b.d.coll == AR_REDUCE_SCATTER && name == "halving_doubling")
        a = new gloo::ReduceScatterHalvingDoubling<float>(b.ctx, {b.d.send}, k * n,
                                                          std::vector<int>((size_t)n, k));
    return std::unique_ptr<gloo::Algorithm>(a);
}

// Sets d.run for `name`: 0, or -1 when the collective has no such algorithm.
int choose(Bench &b, const std::string &name)
{
    bool is_new = name.rfind("new_", 0) == 0;
    b.d.run = run_class;
    if (!is_new)
        return ("," + std::string(ar_gloo_algos(b.d.coll)) + ",").find("," + name + ",") ==
                       std::string::npos ? -1 : 0;
    if (b.d.coll == AR_ALLGATHER && name == "new_ring") {
        b.d.run = run_new_allgather;
        return 0;
    }
    if (b.d.coll != AR_ALLREDUCE || (name != "new_ring" && name != "new_bcube"))
        return -1;
    b.new_algo = name == "new_bcube" ? gloo::AllreduceOptions::Algorithm::BCUBE
                                     : gloo::AllreduceOptions::Algorithm::RING;
    b.d.run = run_new_allreduce;
    return 0;
}

// Every size with algorithm `name`: 0, 1 (a call failed) or 2 (no such algorithm).
int measure_algo(Bench &b, const std::string &name, const size_t *sizes, int n_sizes,
                 double budget)
{
    if (choose(b, name))
        return 2;
    for (int i = 0; i < n_sizes; i++) {
        if (b.d.run == run_class)
            b.algo = make_class(name, b, ar_count(b.d.coll, sizes[i], b.d.size));
        if (ar_measure(&b.d, "gloo", name.c_str(), sizes[i], budget))
            return 1;
        b.algo.reset();
    }
    return 0;
}

int usage(const char *why)
{
    std::fprintf(stderr, "allreduce_gloo: %s\nusage: allreduce_gloo --rank R --size N --store DIR "
                         "--sizes BYTES,... [--budget S] [--collective C] [--algos A,B,...]\n",
                 why);
    return 2;
}

} // namespace

int main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    Bench b;
    const char *store = nullptr, *algos = nullptr;
    size_t sizes[AR_MAX_SIZES];
    int n_sizes = -1;
    double budget = 0.3;
    b.d.rank = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i];
        if (k == "--rank")
            b.d.rank = std::atoi(argv[i + 1]);
        else if (k == "--size")
            b.d.size = std::atoi(argv[i + 1]);
        else if (k == "--store")
            store = argv[i + 1];
        else if (k == "--sizes")
            n_sizes = ar_parse_sizes(argv[i + 1], sizes, AR_MAX_SIZES);
        else if (k == "--budget")
            budget = std::atof(argv[i + 1]);
        else if (k == "--collective")
            b.d.coll = ar_coll_parse(argv[i + 1]);
        else if (k == "--algos")
            algos = argv[i + 1];
        else
            return usage(("unknown option " + k).c_str());
    }
    int rank = b.d.rank, size = b.d.size;
    if (rank < 0 || size < 1 || rank >= size || !store || n_sizes <= 0 || budget <= 0 ||
        b.d.coll < 0)
        return usage("missing or bad option");
    std::string list = algos ? algos : ar_gloo_algos(b.d.coll);

    size_t max = 0;
    for (int i = 0; i < n_sizes; i++)
        max = sizes[i] > max ? sizes[i] : max;
    if (ar_alloc_bufs(&b.d, max)) {
        std::fprintf(stderr, "allreduce_gloo: cannot allocate the buffers for %zu bytes\n", max);
        return 1;
    }
    if (b.d.coll == AR_REDUCE_SCATTER) { // Gloo's result stays in the input buffer
        std::free(b.d.recv);
        b.d.recv = b.d.send;
    }
    try {
        gloo::transport::tcp::attr attr("127.0.0.1");
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::FileStore fs(store);
        bool pow2 = (size & (size - 1)) == 0;
        b.ctx = std::make_shared<gloo::rendezvous::Context>(rank, size, pow2 ? 2 : size);
        b.ctx->setTimeout(std::chrono::seconds(60));
        b.ctx->connectFullMesh(fs, dev);
        b.d.ctx = &b;
        b.d.verify = 1;
        b.d.max_i64 = max_i64;
        b.d.barrier = barrier;
        for (size_t pos = 0; pos <= list.size();) {
            size_t comma = list.find(',', pos);
            std::string name = list.substr(pos, comma == std::string::npos ? comma : comma - pos);
            pos = comma == std::string::npos ? list.size() + 1 : comma + 1;
            int rc = measure_algo(b, name, sizes, n_sizes, budget);
            if (rc == 2)
                return usage(("unknown algorithm " + name + " for " +
                              ar_coll_name(b.d.coll)).c_str());
            if (rc)
                return 1;
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "allreduce_gloo: rank %d: %s\n", rank, e.what());
        return 1;
    }
    ar_free_bufs(&b.d);
    return 0;
}
