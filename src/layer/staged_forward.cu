// The staged forward: see mok/gpu/staged_forward.hpp. Every kernel reads the device status first
// and does nothing once an earlier step has failed, so a bad batch never writes out of bounds.
#include <algorithm>
#include <string>

#include "mok/error.hpp"
#include "mok/gpu/grouped_gemm.hpp"
#include "layer/forward_schedule.hpp"
#include "mok/gpu/staged_forward.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu {
namespace {

using detail::check_cuda;
using detail::device_alloc;
using detail::kTileRows;
using detail::Status;

// One warp per routed row: the token row in (token, k) order inside its expert, or zeros for
// padding; records where each (token, k) slot's row went.
__global__ void gather_kernel(const uint4* x, int64_t row_vecs, const int32_t* counts,
                              const int32_t* offsets, const int32_t* sorted,
                              const int64_t* seg_begin, int experts, int top_k, int64_t rows,
                              uint4* routed, int32_t* slot_row, const Status* st) {
  if (detail::schedule_failed(st)) return;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows;
       row += warps) {
    const int e = sched::segment_of_row(row, seg_begin, experts);
    if (e < 0) return;  // past the last segment; rows only grow along this warp's walk
    const int64_t slot = sched::routed_row_slot(row, e, seg_begin, counts, offsets, sorted);
    uint4* dst = routed + row * row_vecs;
    if (slot >= 0) {
      const uint4* src = x + sched::slot_token(slot, top_k) * row_vecs;
      for (int64_t v = lane; v < row_vecs; v += 32) dst[v] = src[v];
      if (lane == 0) slot_row[slot] = int32_t(row);
    } else {
      for (int64_t v = lane; v < row_vecs; v += 32) dst[v] = make_uint4(0, 0, 0, 0);
    }
  }
}

// x into the shared GEMM's padded rows (zeros past the last token of the last tile).
__global__ void pad_rows_kernel(const uint4* x, int64_t row_vecs, int64_t tokens, int64_t rows,
                                uint4* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * row_vecs;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = i / row_vecs < tokens ? x[i] : make_uint4(0, 0, 0, 0);
}

// out[t] = shared[t] + sum_k w[t,k] * y[row(t,k)] in FP32, k in fixed order; NaN where the batch
// failed (the host's check() then says why), so nothing wrong passes silently.
__global__ void combine_kernel(const __nv_bfloat16* y, const __nv_bfloat16* y_shared,
                               const int32_t* slot_row, const float* weights, int64_t tokens,
                               int top_k, int hidden, __nv_bfloat16* out, const Status* st) {
  const bool bad = detail::schedule_failed(st);
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; t < tokens; t += warps) {
    for (int c = 2 * lane; c < hidden; c += 64) {
      float2 acc = y_shared ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
                                  y_shared + t * hidden + c))
                            : make_float2(0.0f, 0.0f);
      for (int k = 0; k < top_k; ++k) {
        const int32_t r = slot_row[t * top_k + k];
        const float w = weights[t * top_k + k];
        const float2 v =
            r >= 0 ? __bfloat1622float2(
                         *reinterpret_cast<const __nv_bfloat162*>(y + int64_t(r) * hidden + c))
                   : make_float2(__int_as_float(0x7FC00000), __int_as_float(0x7FC00000));
        acc.x = __fmaf_rn(w, v.x, acc.x);
        acc.y = __fmaf_rn(w, v.y, acc.y);
      }
      if (bad) acc = make_float2(__int_as_float(0x7FC00000), __int_as_float(0x7FC00000));
      *reinterpret_cast<__nv_bfloat162*>(out + t * hidden + c) =
          __floats2bfloat162_rn(acc.x, acc.y);
    }
  }
}

int grid_for(int64_t work, int per_block) {
  return int(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, 4 * 132));
}

// One SwiGLU MLP per m-tile's expert, as two grouped GEMMs: act = silu(x gate^T) * (x up^T)
// with the fused epilogue, then y = act down^T. The routed and the shared experts both use it.
struct MlpLaunch {
  const __nv_bfloat16* x;  // [rows, H]
  const __nv_bfloat16 *gate, *up, *down;
  const int32_t* tile_expert;
  int64_t rows;
  int experts, width;  // width: the intermediate size
  __nv_bfloat16* act;  // [rows, width]
  __nv_bfloat16* y;    // [rows, H]
};

void run_swiglu_mlp(const MlpLaunch& m, int hidden, int* error, cudaStream_t stream,
                    const char* what) {
  GroupedGemmArgs g;
  g.a = m.x;
  g.b = m.gate;
  g.b_up = m.up;
  g.tile_expert = m.tile_expert;
  g.out = m.act;
  g.rows = m.rows;
  g.n = 2 * m.width;
  g.k = hidden;
  g.experts = m.experts;
  g.epilogue = GemmEpilogue::swiglu;
  g.error = error;
  check_cuda(grouped_gemm_bf16(g, stream), (std::string(what) + ": gate/up GEMM").c_str());
  g.a = m.act;
  g.b = m.down;
  g.b_up = nullptr;
  g.out = m.y;
  g.n = hidden;
  g.k = m.width;
  g.epilogue = GemmEpilogue::store;
  check_cuda(grouped_gemm_bf16(g, stream), (std::string(what) + ": down GEMM").c_str());
}

}  // namespace

struct StagedForward::Workspace {
  detail::ScheduleBuffers sched;
  int32_t* slot_row;
  __nv_bfloat16 *routed_x, *act, *y, *x_pad, *act_shared, *y_shared;
  int* gemm_error;
};

StagedForward::StagedForward(const Config& c) : config_(c), ws_(nullptr) {
  c.validate();
  if (c.ep_size != 1)
    throw Error(ErrorCode::unsupported, "StagedForward runs one GPU (ep_size = 1), got ep_size = " +
                                            std::to_string(c.ep_size));
  if (c.precision != Precision::bf16)
    throw Error(ErrorCode::unsupported, std::string("precision ") + precision_name(c.precision) +
                                            ": the staged forward is BF16 only");
  const int64_t K = c.top_k, H = c.hidden, I = c.intermediate, S = c.shared_width();
  auto* w = new Workspace{};
  ws_ = w;
  const char* what = "cudaMalloc (StagedForward workspace)";
  w->sched.allocate(c);
  const int64_t capacity = w->sched.capacity, token_rows = w->sched.token_rows;
  w->slot_row = device_alloc<int32_t>(size_t(int64_t(c.max_tokens_per_rank) * K), what);
  w->routed_x = device_alloc<__nv_bfloat16>(size_t(capacity * H), what);
  w->act = device_alloc<__nv_bfloat16>(size_t(capacity * I), what);
  w->y = device_alloc<__nv_bfloat16>(size_t(capacity * H), what);
  w->x_pad = S ? device_alloc<__nv_bfloat16>(size_t(token_rows * H), what) : nullptr;
  w->act_shared = S ? device_alloc<__nv_bfloat16>(size_t(token_rows * S), what) : nullptr;
  w->y_shared = S ? device_alloc<__nv_bfloat16>(size_t(token_rows * H), what) : nullptr;
  w->gemm_error = device_alloc<int>(1, what);
  check_cuda(cudaMemset(w->gemm_error, 0, sizeof(int)), "cudaMemset");
}

StagedForward::~StagedForward() {
  if (!ws_) return;
  ws_->sched.release();
  for (void* p :
       {(void*)ws_->slot_row, (void*)ws_->routed_x, (void*)ws_->act, (void*)ws_->y,
        (void*)ws_->x_pad, (void*)ws_->act_shared, (void*)ws_->y_shared, (void*)ws_->gemm_error})
    cudaFree(p);
  delete ws_;
}

void StagedForward::forward(const DeviceBatch& b, const DeviceLayerWeights& wt, __nv_bfloat16* out,
                            cudaStream_t stream) {
  const Config& c = config_;
  Workspace& w = *ws_;
  const detail::ScheduleBuffers& s = w.sched;
  detail::require_token_count(b.tokens, c);
  const int64_t T = b.tokens, K = c.top_k, H = c.hidden, S = c.shared_width();
  const int E = c.num_experts;
  check_cuda(cudaMemsetAsync(w.slot_row, 0xFF,
                             sizeof(int32_t) * size_t(std::max<int64_t>(T * K, 1)), stream),
             "cudaMemsetAsync");
  detail::build_forward_schedule(b, int(K), E, s, stream);
  const int64_t row_vecs = H * 2 / 16;
  gather_kernel<<<grid_for(s.capacity * 32, 256), 256, 0, stream>>>(
      reinterpret_cast<const uint4*>(b.x), row_vecs, s.counts, s.offsets, s.sorted, s.seg_begin, E,
      int(K), s.capacity, reinterpret_cast<uint4*>(w.routed_x), w.slot_row, s.status);
  check_cuda(cudaGetLastError(), "gather kernel");

  run_swiglu_mlp({w.routed_x, wt.gate, wt.up, wt.down, s.tile_expert, s.capacity, E, c.intermediate,
                  w.act, w.y},
                 c.hidden, w.gemm_error, stream, "routed experts");
  if (S > 0 && T > 0) {
    const int64_t rows = sched::pad_to_tile(T, kTileRows);
    pad_rows_kernel<<<grid_for(rows * row_vecs, 256), 256, 0, stream>>>(
        reinterpret_cast<const uint4*>(b.x), row_vecs, T, rows, reinterpret_cast<uint4*>(w.x_pad));
    run_swiglu_mlp({w.x_pad, wt.shared_gate, wt.shared_up, wt.shared_down, s.shared_tiles, rows, 1,
                    int(S), w.act_shared, w.y_shared},
                   c.hidden, w.gemm_error, stream, "shared experts");
  }
  if (T > 0)
    combine_kernel<<<grid_for(T * 32, 256), 256, 0, stream>>>(w.y, S > 0 ? w.y_shared : nullptr,
                                                              w.slot_row, b.topk_weights, T, int(K),
                                                              int(H), out, s.status);
  check_cuda(cudaGetLastError(), "combine kernel");
}

void StagedForward::check(cudaStream_t stream) {
  Status st{};
  int gemm_error = 0;
  check_cuda(cudaMemcpyAsync(&st, ws_->sched.status, sizeof st, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(&gemm_error, ws_->gemm_error, sizeof gemm_error,
                             cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the forward");
  detail::throw_on_status(st, config_.num_experts, ws_->sched.capacity);
  if (gemm_error != 0)
    throw Error(ErrorCode::peer_timeout,
                "a GEMM's pipeline wait expired (code " + std::to_string(gemm_error) + ")");
}

}  // namespace mok::gpu
