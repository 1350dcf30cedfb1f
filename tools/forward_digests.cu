// forward_digests: prints a 64-bit FNV-1a digest of the GPU forward's output bits for the standard
// shapes and the odd cases (empty experts, skewed routing, token counts that are not tile
// multiples, no shared experts, both row paths and tile widths, emulated EP groups). A refactor
// that must change no output bit is checked by running this before and after it and diffing the
// two listings. Uses the public API only, so the same file builds against older trees.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mok/config.hpp"
#include "mok/error.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/random_fill.hpp"

namespace {

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

template <class T>
T* alloc(size_t n) {
  void* p = nullptr;
  cuda(cudaMalloc(&p, n * sizeof(T) + 16), "cudaMalloc");
  return static_cast<T*>(p);
}

enum class Routing { random, skewed };

// One layer's device data: weights (all experts), x, ids, weights, and the output.
struct Layer {
  mok::Config c;
  int64_t tokens;
  __nv_bfloat16 *sg = nullptr, *su = nullptr, *sd = nullptr, *g, *u, *d, *x, *out;
  int32_t* ids;
  float* w;

  Layer(const mok::Config& cfg, int64_t t, Routing routing, uint64_t seed) : c(cfg), tokens(t) {
    const int64_t H = c.hidden, I = c.intermediate, E = c.num_experts, S = c.shared_width(),
                  K = c.top_k;
    auto fill = [&](__nv_bfloat16*& p, int64_t n, uint64_t s, float bound) {
      p = alloc<__nv_bfloat16>(size_t(n));
      cuda(mok::gpu::fill_uniform_bf16(p, n, s, bound, nullptr), "fill");
    };
    const float wb = 1.0f / std::sqrt(float(H));
    if (S > 0) {
      fill(sg, S * H, seed + 1, wb);
      fill(su, S * H, seed + 2, wb);
      fill(sd, H * S, seed + 3, 1.0f / std::sqrt(float(S)));
    }
    fill(g, E * I * H, seed + 4, wb);
    fill(u, E * I * H, seed + 5, wb);
    fill(d, E * H * I, seed + 6, 1.0f / std::sqrt(float(I)));
    fill(x, std::max<int64_t>(t, 1) * H, seed + 7, 1.0f);
    ids = alloc<int32_t>(size_t(std::max<int64_t>(t, 1) * K));
    w = alloc<float>(size_t(std::max<int64_t>(t, 1) * K));
    if (routing == Routing::random) {
      cuda(mok::gpu::random_topk(ids, w, t, int(E), int(K), seed + 8, nullptr), "random_topk");
    } else {  // every token to the same K experts (one expert gets them all; the rest are empty)
      std::vector<int32_t> hid(size_t(t * K));
      std::vector<float> hw(size_t(t * K));
      for (int64_t i = 0; i < t; ++i)
        for (int64_t k = 0; k < K; ++k) {
          hid[size_t(i * K + k)] = int32_t(k);
          hw[size_t(i * K + k)] = float(k + 1) / float(K * (K + 1) / 2);
        }
      cuda(cudaMemcpy(ids, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice), "memcpy");
      cuda(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice), "memcpy");
    }
    out = alloc<__nv_bfloat16>(size_t(std::max<int64_t>(t, 1) * H));
    cuda(cudaDeviceSynchronize(), "fill");
  }
  ~Layer() {
    for (void* p : {(void*)sg, (void*)su, (void*)sd, (void*)g, (void*)u, (void*)d, (void*)x,
                    (void*)out, (void*)ids, (void*)w})
      cudaFree(p);
  }
  mok::gpu::DeviceLayerWeights weights(int rank = 0, int ranks = 1) const {
    const int64_t H = c.hidden, I = c.intermediate, El = c.num_experts / ranks;
    return {sg, su, sd, g + rank * El * I * H, u + rank * El * I * H, d + rank * El * H * I,
            {}, {}, {}};
  }
};

// FNV-1a over the output bits; also counts non-finite values (a digest of garbage is no proof).
struct Digest {
  uint64_t hash = 1469598103934665603ull;
  int64_t non_finite = 0;
  void add(const std::vector<uint16_t>& v) {
    for (uint16_t b : v) {
      for (int i = 0; i < 2; ++i) hash = (hash ^ ((b >> (8 * i)) & 0xFF)) * 1099511628211ull;
      if ((b & 0x7F80) == 0x7F80) ++non_finite;
    }
  }
};

std::vector<uint16_t> download(const __nv_bfloat16* p, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  if (n > 0) cuda(cudaMemcpy(h.data(), p, size_t(n) * 2, cudaMemcpyDeviceToHost), "download");
  return h;
}

void print(const std::string& name, const Digest& d) {
  std::printf("%-58s %016llx non-finite %lld\n", name.c_str(), (unsigned long long)d.hash,
              (long long)d.non_finite);
  std::fflush(stdout);
}

void run_one(const std::string& name, Layer& L, const mok::gpu::ForwardOptions& o) {
  cuda(cudaMemset(L.out, 0xFF, size_t(std::max<int64_t>(L.tokens, 1) * L.c.hidden) * 2), "poison");
  mok::gpu::MoeForward f(L.c, o);
  f.forward({L.tokens, L.x, L.ids, L.w}, L.weights(), L.out, nullptr);
  f.check(nullptr);
  Digest d;
  d.add(download(L.out, L.tokens * L.c.hidden));
  print(name, d);
}

// The same global batch split over `ranks` emulated ranks (contiguous tokens, experts in order).
void run_emulated(const std::string& name, Layer& L, int ranks, const mok::gpu::ForwardOptions& o) {
  mok::Config c = L.c;
  c.ep_size = ranks;
  c.max_tokens_per_rank = int((L.tokens + ranks - 1) / ranks);
  cuda(cudaMemset(L.out, 0xFF, size_t(std::max<int64_t>(L.tokens, 1) * c.hidden) * 2), "poison");
  std::vector<mok::gpu::DeviceBatch> batches;
  std::vector<mok::gpu::DeviceLayerWeights> weights;
  std::vector<__nv_bfloat16*> outs;
  for (int r = 0; r < ranks; ++r) {
    const int64_t t0 = std::min<int64_t>(L.tokens, r * int64_t(c.max_tokens_per_rank));
    const int64_t t1 = std::min<int64_t>(L.tokens, (r + 1) * int64_t(c.max_tokens_per_rank));
    batches.push_back({t1 - t0, L.x + t0 * c.hidden, L.ids + t0 * c.top_k, L.w + t0 * c.top_k});
    weights.push_back(L.weights(r, ranks));
    outs.push_back(L.out + t0 * c.hidden);
  }
  mok::gpu::EmulatedEpForward f(c, o);
  f.forward(batches, weights, outs, nullptr);
  f.check(nullptr);
  Digest d;
  d.add(download(L.out, L.tokens * c.hidden));
  print(name, d);
}

mok::Config shape(const std::string& preset, int64_t tokens, int shared = -1) {
  mok::Config c = mok::preset(preset);
  c.max_tokens_per_rank = int(tokens);
  if (shared == 0) c.num_shared_experts = 0, c.shared_intermediate = 0;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";  // skips the large shapes
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("forward_digests: no GPU\n");
    return 0;
  }
  using mok::gpu::ForwardOptions;
  using mok::gpu::RowPath;
  ForwardOptions automatic, copy, gather, narrow;
  copy.row_path = RowPath::dispatch_copy;
  gather.row_path = RowPath::producer_gather;
  narrow.block_n = 128;
  try {
    struct Case {
      const char* preset;
      int64_t tokens;
      int shared;  // -1: the preset's
      Routing routing;
    };
    std::vector<Case> cases = {
        {"tiny", 1, -1, Routing::random},         {"tiny", 77, -1, Routing::random},
        {"tiny", 333, -1, Routing::random},       {"tiny", 333, -1, Routing::skewed},
        {"tiny", 0, -1, Routing::random},         {"tiny", 200, 0, Routing::random},
        {"qwen3-30b", 1000, -1, Routing::random}, {"qwen3-30b", 130, -1, Routing::skewed},
        {"fine", 515, -1, Routing::random},       {"mok-default", 600, -1, Routing::random},
    };
    if (!quick) {
      for (const char* p : {"dsv3", "mok-default", "qwen3-30b", "fine"})
        cases.push_back({p, 4096, -1, Routing::random});
      cases.push_back({"dsv3", 8192, -1, Routing::random});
    }
    uint64_t seed = 1000;
    for (const Case& k : cases) {
      const mok::Config c = shape(k.preset, std::max<int64_t>(k.tokens, 1), k.shared);
      Layer L(c, k.tokens, k.routing, seed += 100);
      const std::string base = std::string(k.preset) + " T=" + std::to_string(k.tokens) +
                               (k.shared == 0 ? " no-shared" : "") +
                               (k.routing == Routing::skewed ? " skewed" : "");
      run_one(base + " auto", L, automatic);
      run_one(base + " copy", L, copy);
      run_one(base + " gather", L, gather);
      run_one(base + " block_n=128", L, narrow);
      const bool big = c.hidden * int64_t(c.intermediate) * c.num_experts > (int64_t(1) << 33);
      if (k.tokens >= 2 && !big) {
        for (int ranks : {2, 4}) {
          if (c.num_experts % ranks) continue;
          run_emulated(base + " emulated EP=" + std::to_string(ranks) + " copy", L, ranks, copy);
          run_emulated(base + " emulated EP=" + std::to_string(ranks) + " gather", L, ranks,
                       gather);
        }
      }
    }
  } catch (const mok::Error& e) {
    std::fprintf(stderr, "forward_digests: %s\n", e.what());
    return 1;
  }
  return 0;
}
