// Expert parallelism on one GPU: see mok/gpu/emulated_ep_forward.hpp. Every rank builds its source
// schedule; one small kernel builds every owner's tables from all sources' counts (and the group's
// status: any rank's bad id or any owner's overflow fails every rank); one megakernel launch runs
// all ranks, each on its share of the grid, reaching the others through the peer tables.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/moe_forward/forward_params.hpp"
#include "layer/forward_schedule.hpp"
#include "layer/rank_forward.hpp"
#include "mok/error.hpp"
#include "mok/gpu/emulated_ep_forward.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu {
namespace {

using detail::check_cuda;
using detail::kTileRows;
using detail::Status;

constexpr int kMaxExperts = 512;  // Config::validate's bound

struct OwnerScheduleArgs {
  int ranks, experts;
  int64_t capacity, capacity_blocks;
  const int32_t* counts[kern::kMaxRanks];  // each source's [E]
  const Status* source_status[kern::kMaxRanks];
  int64_t* seg_begin[kern::kMaxRanks];
  int64_t* segment_rows[kern::kMaxRanks];
  int64_t* source_begin[kern::kMaxRanks];
  int32_t* tile_expert[kern::kMaxRanks];
  Status* group_status[kern::kMaxRanks];
};

// Block r builds owner r's tables, with the same host/device code as the EP simulation
// (sched::build_segments), and the group's status: every block reaches the same verdict.
__global__ void owner_schedule_kernel(const __grid_constant__ OwnerScheduleArgs a) {
  __shared__ int32_t counts[kern::kMaxRanks * kMaxExperts];  // [source][expert]
  __shared__ int failed;
  const int owner = int(blockIdx.x), n = a.ranks, e_all = a.experts;
  for (int i = int(threadIdx.x); i < n * e_all; i += int(blockDim.x))
    counts[i] = a.counts[i / e_all][i % e_all];
  __syncthreads();
  if (threadIdx.x == 0) {
    Status st{};
    for (int src = 0; src < n && st.code == detail::kOk; ++src)
      if (a.source_status[src]->code != detail::kOk) {
        st = *a.source_status[src];
        st.rank = src;
      }
    for (int o = 0; o < n && st.code == detail::kOk; ++o) {
      const int64_t need = sched::padded_rows_of_rank(counts, n, e_all, o, kTileRows);
      if (need > a.capacity) {
        st.code = detail::kCapacityExceeded;
        st.needed_rows = need;
        st.rank = o;
      }
    }
    *a.group_status[owner] = st;
    failed = st.code != detail::kOk;
    sched::build_segments(counts, n, e_all, owner, kTileRows, a.seg_begin[owner],
                          a.segment_rows[owner], a.source_begin[owner]);
  }
  __syncthreads();
  const int local = e_all / n;
  for (int64_t m = threadIdx.x; m < a.capacity_blocks; m += blockDim.x)
    a.tile_expert[owner][m] =
        failed ? -1 : sched::segment_of_row(m * kTileRows, a.seg_begin[owner], local);
}

void require(bool ok, ErrorCode code, const std::string& message) {
  if (!ok) throw Error(code, message);
}

}  // namespace

struct EmulatedEpForward::Workspace {
  std::vector<detail::RankBuffers> ranks;
  int* aborted = nullptr;
};

EmulatedEpForward::EmulatedEpForward(const Config& c, const ForwardOptions& options, int stuck_rank)
    : config_(c), options_(options), stuck_rank_(stuck_rank), ws_(nullptr) {
  c.validate();
  const int n = c.ep_size;
  require(n == 2 || n == 4 || n == 8, ErrorCode::unsupported,
          "EmulatedEpForward runs ep_size 2, 4 or 8 logical ranks, got " + std::to_string(n));
  require(c.precision == Precision::bf16, ErrorCode::unsupported,
          std::string("precision ") + precision_name(c.precision) +
              ": the GPU forward is BF16 only for now");
  require(c.num_experts <= kMaxExperts, ErrorCode::unsupported, "at most 512 experts");
  const int64_t I = c.intermediate, S = c.shared_width();
  require(c.hidden % 64 == 0 && I % 64 == 0 && S % 64 == 0, ErrorCode::unsupported,
          "the GPU forward needs hidden, intermediate and the shared width to be multiples of 64");
  const bool wide_ok = I % 128 == 0 && S % 128 == 0;
  block_n_ = options.block_n == 0 ? (wide_ok ? 256 : 128) : options.block_n;
  require(block_n_ == 128 || (block_n_ == 256 && wide_ok), ErrorCode::invalid_argument,
          "block_n = " + std::to_string(options.block_n) +
              ": allowed 0 (automatic), 128, or 256 when I and S are multiples of 128");
  if (options_.wait_seconds == 0) {
    const char* env = std::getenv("MOK_WAIT_SECONDS");
    options_.wait_seconds = env ? std::atof(env) : 2.0;
  }
  require(options_.wait_seconds > 0 && options_.wait_seconds <= 600, ErrorCode::invalid_argument,
          "wait_seconds must be in (0, 600]");
  int device = 0, sms = 0, clock_khz = 0, per_sm = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute");
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device) != cudaSuccess ||
      clock_khz <= 0)
    clock_khz = 2'000'000;
  check_cuda(kern::prepare_moe_forward(block_n_, &per_sm), "preparing the forward kernel");
  require(per_sm >= 1, ErrorCode::unsupported, "the forward kernel does not fit on an SM");
  grid_ = options.max_ctas > 0 ? std::min(options.max_ctas, sms) : sms;
  const int share = grid_ / n;
  dispatch_ctas_ = options.dispatch_ctas > 0
                       ? options.dispatch_ctas
                       : std::max(1, num_dispatch_ctas(share, c.intermediate));
  require(share >= 2 && dispatch_ctas_ < share, ErrorCode::invalid_argument,
          "a grid of " + std::to_string(grid_) + " CTAs gives each of " + std::to_string(n) +
              " ranks " + std::to_string(share) + " CTAs, too few for " +
              std::to_string(dispatch_ctas_) + " dispatch CTAs and the GEMMs");
  require(options.dispatch_lookahead <= 0, ErrorCode::unsupported,
          "dispatch_lookahead is not supported with emulated ranks");
  wait_cycles_ = uint64_t(options_.wait_seconds * double(clock_khz) * 1e3);
  auto* w = new Workspace{};
  ws_ = w;
  w->ranks.resize(size_t(n));
  for (auto& r : w->ranks) r.allocate(c, options.profile_wait_times);
  w->aborted = detail::device_alloc<int>(1, "cudaMalloc (EmulatedEpForward)");
}

EmulatedEpForward::~EmulatedEpForward() {
  if (!ws_) return;
  for (auto& r : ws_->ranks) r.release();
  cudaFree(ws_->aborted);
  delete ws_;
}

void EmulatedEpForward::forward(const std::vector<DeviceBatch>& batches,
                                const std::vector<DeviceLayerWeights>& weights,
                                const std::vector<__nv_bfloat16*>& outs, cudaStream_t stream) {
  const Config& c = config_;
  const int n = c.ep_size;
  require(int(batches.size()) == n && int(weights.size()) == n && int(outs.size()) == n,
          ErrorCode::invalid_argument,
          "one batch, one set of weights and one output per rank (" + std::to_string(n) + ")");
  for (int r = 0; r < n; ++r)
    require(batches[size_t(r)].tokens >= 0 && batches[size_t(r)].tokens <= c.max_tokens_per_rank,
            ErrorCode::invalid_argument,
            "rank " + std::to_string(r) + ": tokens = " +
                std::to_string(batches[size_t(r)].tokens) + " is outside [0, max_tokens_per_rank]");
  auto& ranks = ws_->ranks;
  for (int r = 0; r < n; ++r)
    detail::build_forward_schedule(batches[size_t(r)], c.top_k, c.num_experts,
                                   ranks[size_t(r)].sched, stream, /*owner_tables=*/false);
  OwnerScheduleArgs a{};
  a.ranks = n;
  a.experts = c.num_experts;
  a.capacity = ranks[0].sched.capacity;
  a.capacity_blocks = ranks[0].capacity_blocks;
  for (int r = 0; r < n; ++r) {
    const detail::RankBuffers& w = ranks[size_t(r)];
    a.counts[r] = w.sched.counts;
    a.source_status[r] = w.sched.status;
    a.seg_begin[r] = w.owner_seg_begin;
    a.segment_rows[r] = w.owner_segment_rows;
    a.source_begin[r] = w.owner_source_begin;
    a.tile_expert[r] = w.owner_tile_expert;
    a.group_status[r] = w.group_status;
  }
  owner_schedule_kernel<<<n, 256, 0, stream>>>(a);
  check_cuda(cudaGetLastError(), "the owner schedule kernel");
  for (const auto& w : ranks) w.reset(stream);
  check_cuda(cudaMemsetAsync(ws_->aborted, 0, sizeof(int), stream), "cudaMemsetAsync");

  kern::ForwardLaunch launch{};
  launch.ranks = n;
  for (int r = 0; r < n; ++r) {
    detail::RankLaunchOptions o;
    o.ep_rank = r;
    o.dispatch_ctas = dispatch_ctas_;
    o.wait_cycles = wait_cycles_;
    o.aborted = ws_->aborted;
    ForwardOptions rank_options = options_;
    if (r != stuck_rank_) rank_options.never_publish_block = -1;
    o.options = &rank_options;
    launch.maps[r] =
        detail::rank_maps(ranks[size_t(r)], c, batches[size_t(r)], weights[size_t(r)], block_n_);
    launch.params[r] =
        detail::rank_params(ranks[size_t(r)], c, batches[size_t(r)], outs[size_t(r)], o);
  }
  for (int r = 0; r < n; ++r)  // every rank reaches every other rank's buffers
    for (int q = 0; q < n; ++q) {
      const kern::ForwardParams& other = launch.params[q];
      kern::ForwardParams& p = launch.params[r];
      p.peer_x[q] = other.peer_x[q];
      p.peer_offsets[q] = other.peer_offsets[q];
      p.peer_sorted[q] = other.peer_sorted[q];
      p.peer_y_slots[q] = other.peer_y_slots[q];
      p.peer_token_done[q] = other.peer_token_done[q];
    }
  check_cuda(kern::launch_moe_forward(launch, block_n_, grid_, stream),
             "the forward megakernel (emulated EP)");
}

void EmulatedEpForward::check(cudaStream_t stream) {
  const int n = config_.ep_size;
  Status st{};
  std::vector<kern::ForwardFault> faults(static_cast<size_t>(n));
  check_cuda(
      cudaMemcpyAsync(&st, ws_->ranks[0].group_status, sizeof st, cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync");
  for (int r = 0; r < n; ++r)
    check_cuda(cudaMemcpyAsync(&faults[size_t(r)], ws_->ranks[size_t(r)].fault,
                               sizeof(kern::ForwardFault), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the forward");
  detail::throw_on_status(st, config_.num_experts, ws_->ranks[0].sched.capacity, n);
  // The most upstream role of any rank is the cause.
  for (int role = 0; role < kern::kForwardRoles; ++role)
    for (int r = 0; r < n; ++r) {
      const auto& rec = faults[size_t(r)].records[role];
      if (!rec.seen) continue;
      throw Error(ErrorCode::peer_timeout,
                  "rank " + std::to_string(r) +
                      ": the forward stopped: " + detail::fault_role_name(role) + " " +
                      std::to_string(rec.what) + " gave up after " +
                      std::to_string(options_.wait_seconds) + " s; the output is incomplete");
    }
}

}  // namespace mok::gpu
