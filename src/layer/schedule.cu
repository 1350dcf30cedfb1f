// gpu::Schedule and gpu::ForwardContext: caller-owned device buffers (mok/gpu/schedule.hpp).
#include "mok/gpu/schedule.hpp"

#include "layer/rank_forward.hpp"
#include "mok/error.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok::gpu {

Schedule::Schedule(const Config& c) : state_(std::make_unique<detail::RankSchedule>()) {
  c.validate();
  state_->allocate(c);
}
Schedule::~Schedule() {
  if (state_) state_->release();
}
int64_t Schedule::capacity_rows() const { return state_->sched.capacity; }
int64_t Schedule::tokens() const { return state_->tokens; }

const char* gate_up_mode_name(GateUpMode m) {
  return m == GateUpMode::keep ? "keep" : m == GateUpMode::recompute ? "recompute" : "?";
}

int64_t ForwardContext::bytes_per_token(const Config& c, GateUpMode mode) {
  if (mode == GateUpMode::recompute) return 0;
  const int64_t KI = int64_t(c.top_k) * c.intermediate, S = c.shared_width();
  if (c.precision == Precision::fp8_block) return 5 * KI + KI / 32 + 6 * S;
  return 6 * KI + 6 * S;
}

ForwardContext::ForwardContext(const Config& c, GateUpMode mode)
    : mode_(mode), precision_(c.precision) {
  c.validate();
  detail::require(mode == GateUpMode::keep || mode == GateUpMode::recompute,
                  ErrorCode::invalid_argument,
                  "ForwardContext: mode must be GateUpMode::keep or GateUpMode::recompute");
  const char* what = "cudaMalloc (ForwardContext)";
  capacity_rows_ = sched::pad_to_tile(c.capacity_rows(), detail::kTileRows);
  token_rows_ = sched::pad_to_tile(c.max_tokens_per_rank, detail::kTileRows);
  intermediate_ = c.intermediate;
  shared_width_ = c.shared_width();
  const int64_t I = c.intermediate, S = c.shared_width();
  if (mode == GateUpMode::recompute) return;
  try {
    if (precision_ == Precision::fp8_block) {  // the down GEMM's E4M3 operand
      act_e4m3_ = detail::device_alloc<uint8_t>(size_t(capacity_rows_ * I), what);
      act_scales_ = detail::device_alloc<float>(size_t(capacity_rows_ * (I / 128)), what);
    } else {
      act_ = detail::device_alloc<__nv_bfloat16>(size_t(capacity_rows_ * I), what);
    }
    gate_up_ = detail::device_alloc<__nv_bfloat16>(size_t(capacity_rows_ * 2 * I), what);
    if (S > 0) {
      act_shared_ = detail::device_alloc<__nv_bfloat16>(size_t(token_rows_ * S), what);
      gate_up_shared_ = detail::device_alloc<__nv_bfloat16>(size_t(token_rows_ * 2 * S), what);
    }
  } catch (...) {  // the destructor does not run for a constructor that throws
    release();
    throw;
  }
}

ForwardContext::~ForwardContext() { release(); }

void ForwardContext::release() {
  for (void* p : {(void*)act_, (void*)gate_up_, (void*)act_shared_, (void*)gate_up_shared_,
                  (void*)act_e4m3_, (void*)act_scales_})
    cudaFree(p);
  act_ = gate_up_ = act_shared_ = gate_up_shared_ = nullptr;
  act_e4m3_ = nullptr;
  act_scales_ = nullptr;
}

}  // namespace mok::gpu
