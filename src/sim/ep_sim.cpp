// EP simulation: see mok/ep_sim.hpp. Memory a peer reads or writes lives in that peer's Window
// ("symmetric memory"); flags are atomics with release/acquire, as the GPU uses at system scope.
#include "mok/ep_sim.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "mok/error.hpp"
#include "mok/schedule/routing_layout.hpp"
#include "reference/layer_sums.hpp"
#include "reference/mlp_math.hpp"

namespace mok {

// Source side: a rank's slots sorted by expert. Owner side: its padded expert segments.
struct RankSchedule {
  std::vector<int32_t> counts, offsets, sorted;
  std::vector<int32_t> counts_by_source;  // [N][E]
  std::vector<int64_t> segment_begin, segment_rows, source_begin;
};
struct SimSchedule {
  std::vector<RankSchedule> ranks;
};

namespace {

using Clock = std::chrono::steady_clock;

// What one rank exposes to its peers.
struct Window {
  const Batch* batch = nullptr;
  const std::vector<double>* d_out = nullptr;
  const RankSchedule* schedule = nullptr;
  std::atomic<uint32_t> schedule_ready{0};
  std::vector<double> y_slots, dx_slots, dw_slots;  // combine targets, [T*K*H] and [T*K]
  std::atomic<int64_t> rows_arrived{0};
};

struct Failure {
  int rank;
  ErrorCode code;
  std::string message;
};

struct Group {
  Config config;
  SimOptions options;
  ref::Rounding rounding;
  std::vector<std::unique_ptr<Window>> windows;
  std::atomic<bool> abort{false};
  std::mutex failures_mutex;
  std::vector<Failure> failures;

  void fail(int rank, ErrorCode code, const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(failures_mutex);
      failures.push_back({rank, code, message});
    }
    abort.store(true, std::memory_order_release);
  }
};

// Injected delays: a role of a rank sleeps at random points, seeded per (seed, rank, role).
class Delays {
 public:
  Delays(const SimOptions& o, int rank, int role)
      : max_us_(o.max_delay_us),
        p_(o.delay_probability),
        rng_(o.seed * 1000003u + uint64_t(rank) * 7919u + uint64_t(role)) {}
  void maybe_sleep() {
    if (max_us_ <= 0) return;
    if (std::uniform_real_distribution<double>(0, 1)(rng_) < p_)
      std::this_thread::sleep_for(std::chrono::microseconds(rng_() % uint64_t(max_us_)));
  }

 private:
  int max_us_;
  double p_;
  std::mt19937_64 rng_;
};

// Bounded spin-wait; `what` describes the wait for the error message. Waits that every rank is
// sure to satisfy first (the count exchange) ignore `abort`, so that a failure decided from the
// exchanged counts (capacity) is reported by every rank itself.
template <class Ready, class What>
void bounded_wait(Group& g, Ready ready, What what, bool stop_on_abort = true) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(g.options.wait_timeout_ms);
  for (int spin = 0; !ready(); ++spin) {
    if (stop_on_abort && g.abort.load(std::memory_order_acquire))
      throw Error(ErrorCode::peer_failed,
                  "stopped waiting for " + what() + ": another rank failed");
    if (Clock::now() > deadline) {
      throw Error(ErrorCode::peer_timeout,
                  "waited " + std::to_string(g.options.wait_timeout_ms) + " ms for " + what());
    }
    // Back off: a few yields, then sleeps growing to 0.5 ms (ranks outnumber cores here).
    if (spin < 16)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::min(500, 10 << std::min(spin - 16, 6))));
  }
}

// Runs f, turning an exception into a recorded failure of (rank, role). True when f succeeded.
template <class F>
bool guarded(Group& g, int rank, const char* role, F&& f) {
  const std::string who = "rank " + std::to_string(rank) + " (" + role + "): ";
  try {
    f();
    return true;
  } catch (const Error& e) {
    g.fail(rank, e.code(), who + e.what());
  } catch (const std::exception& e) {
    g.fail(rank, ErrorCode::invalid_argument, who + e.what());
  }
  return false;
}

// One ring row: the routed row's origin and the data pulled for it.
struct RingRow {
  int source_rank = -1;  // -1: padding
  int32_t slot = 0;      // (token, k) slot on the source
  double weight = 0;     // backward: the routing weight
};

class TokenRing {
 public:
  TokenRing(const Config& c, bool backward)
      : layout_{c.tile_rows, c.effective_ring_rows() / c.tile_rows},
        hidden_(c.hidden),
        rows_(size_t(c.effective_ring_rows())),
        x_(size_t(c.effective_ring_rows() * c.hidden)),
        d_out_(backward ? size_t(c.effective_ring_rows() * c.hidden) : 0),
        filled_(size_t(c.capacity_rows() / c.tile_rows)),
        released_(size_t(c.capacity_rows() / c.tile_rows)) {}

  sched::RingLayout layout() const { return layout_; }
  RingRow& row(int64_t routed_row) { return rows_[size_t(sched::ring_row(routed_row, layout_))]; }
  double* x(int64_t routed_row) {
    return &x_[size_t(sched::ring_row(routed_row, layout_) * hidden_)];
  }
  double* d_out(int64_t routed_row) {
    return &d_out_[size_t(sched::ring_row(routed_row, layout_) * hidden_)];
  }
  // The protocol's counters of routed block `block` (mok/schedule/routing_layout.hpp); the
  // simulation's expert role is each block's one reader.
  static constexpr uint32_t kReaders = 1;
  std::atomic<uint32_t>& filled(int64_t block) { return filled_[size_t(block)]; }
  std::atomic<uint32_t>& released(int64_t block) { return released_[size_t(block)]; }

 private:
  sched::RingLayout layout_;
  int64_t hidden_;
  std::vector<RingRow> rows_;
  std::vector<double> x_, d_out_;
  std::vector<std::atomic<uint32_t>> filled_, released_;
};

RankSchedule build_source_schedule(const Config& c, const Batch& b) {
  RankSchedule s;
  const int E = c.num_experts;
  s.counts.resize(size_t(E));
  s.offsets.resize(size_t(E) + 1);
  s.sorted.resize(size_t(b.tokens * c.top_k));
  std::vector<int32_t> cursor(static_cast<size_t>(E));
  sched::count_rows_per_expert(b.topk_ids.data(), b.tokens, c.top_k, E, s.counts.data());
  sched::exclusive_prefix(s.counts.data(), E, s.offsets.data());
  sched::sort_slots_by_expert(b.topk_ids.data(), b.tokens, c.top_k, E, s.offsets.data(),
                              cursor.data(), s.sorted.data());
  return s;
}

// After every peer's counts are visible: the capacity check of all ranks, then own segments.
void build_owner_schedule(Group& g, int rank, RankSchedule& s) {
  const Config& c = g.config;
  const int N = c.ep_size, E = c.num_experts, L = c.experts_per_rank();
  s.counts_by_source.resize(size_t(N * E));
  for (int q = 0; q < N; ++q) {
    const std::vector<int32_t>& counts = g.windows[size_t(q)]->schedule->counts;
    std::copy(counts.begin(), counts.end(), &s.counts_by_source[size_t(q * E)]);
  }
  int64_t worst = 0;
  int worst_rank = 0;
  for (int q = 0; q < N; ++q) {
    const int64_t need =
        sched::padded_rows_of_rank(s.counts_by_source.data(), N, E, q, c.tile_rows);
    if (need > worst) worst = need, worst_rank = q;
  }
  if (worst > c.capacity_rows()) {
    throw Error(ErrorCode::capacity_exceeded,
                "rank " + std::to_string(worst_rank) + " needs " + std::to_string(worst) +
                    " padded routed rows but the capacity is " + std::to_string(c.capacity_rows()) +
                    " (set routed_capacity_rows >= " + std::to_string(worst) + ")");
  }
  s.segment_begin.resize(size_t(L) + 1);
  s.segment_rows.resize(size_t(L));
  s.source_begin.resize(size_t(L) * size_t(N + 1));
  sched::build_segments(s.counts_by_source.data(), N, E, rank, c.tile_rows, s.segment_begin.data(),
                        s.segment_rows.data(), s.source_begin.data());
}

// Producer: pulls routed rows from the peers into the ring, tile by tile.
void dispatch_role(Group& g, int rank, TokenRing& ring, bool backward) {
  const Config& c = g.config;
  const RankSchedule& s = *g.windows[size_t(rank)]->schedule;
  const int L = c.experts_per_rank();
  const int64_t H = c.hidden, tiles = s.segment_begin[size_t(L)] / c.tile_rows;
  Delays delays(g.options, rank, 1);
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t previous = sched::ring_previous_block(tile, ring.layout());
    bounded_wait(
        g,
        [&] {
          return previous < 0 ||
                 sched::ring_may_fill(ring.released(previous).load(std::memory_order_acquire),
                                      TokenRing::kReaders);
        },
        [&] {
          return "ring tile " + std::to_string(sched::ring_tile(tile, ring.layout())) +
                 " to be freed (by routed block " + std::to_string(previous) + ")";
        });
    for (int64_t row = tile * c.tile_rows; row < (tile + 1) * c.tile_rows; ++row) {
      const sched::RoutedRow loc = sched::locate_routed_row(
          row, s.segment_begin.data(), s.segment_rows.data(), s.source_begin.data(), L, c.ep_size);
      RingRow& r = ring.row(row);
      r.source_rank = loc.source_rank;
      if (loc.source_rank < 0) continue;
      const Window& peer = *g.windows[size_t(loc.source_rank)];
      const int e = sched::global_expert(rank, loc.local_expert, L);
      r.slot = sched::source_slot(peer.schedule->offsets.data(), peer.schedule->sorted.data(), e,
                                  loc.index_in_source_group);
      const int64_t t = sched::slot_token(r.slot, c.top_k);
      std::copy_n(&peer.batch->x[size_t(t * H)], H, ring.x(row));
      if (backward) {
        std::copy_n(&(*peer.d_out)[size_t(t * H)], H, ring.d_out(row));
        r.weight = g.rounding.store(peer.batch->topk_weights[size_t(r.slot)]);
      }
      delays.maybe_sleep();
    }
    ring.filled(tile).store(sched::kRingFilled, std::memory_order_release);
  }
}

// Consumer: the experts' rows, tile by tile; output rows go to the sources' (token, k) slots.
// Forward pushes y; backward pushes dx and d_weight and sums the local weight gradients.
void expert_role(Group& g, int rank, TokenRing& ring, const LayerParams& p, bool backward,
                 LayerParams* grads) {
  const Config& c = g.config;
  const RankSchedule& s = *g.windows[size_t(rank)]->schedule;
  const int L = c.experts_per_rank(), N = c.ep_size;
  const int64_t H = c.hidden, I = c.intermediate, tiles = s.segment_begin[size_t(L)] / c.tile_rows;
  const size_t expert_size = size_t(I * H);
  Delays delays(g.options, rank, 2);
  std::vector<int64_t> sent(size_t(N), 0);

  int current = -1;
  ref::PreparedMlp mlp;
  std::unique_ptr<ref::MlpGradAccumulator> acc;
  auto finish_expert = [&] {
    if (backward && current >= 0)
      acc->finish(g.rounding, &grads->gate[size_t(current) * expert_size],
                  &grads->up[size_t(current) * expert_size],
                  &grads->down[size_t(current) * expert_size]);
  };

  ref::RowForward fwd;
  std::vector<ref::RowBackward> rows(size_t(c.tile_rows));
  std::vector<const ref::RowBackward*> row_ptrs;
  std::vector<const double*> x_ptrs;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    bounded_wait(
        g, [&] { return sched::ring_may_read(ring.filled(tile).load(std::memory_order_acquire)); },
        [&] {
          return "ring tile " + std::to_string(sched::ring_tile(tile, ring.layout())) +
                 " to be filled with routed block " + std::to_string(tile);
        });
    // Segments are padded to whole tiles, so a tile belongs to one expert.
    const int l = sched::locate_routed_row(tile * c.tile_rows, s.segment_begin.data(),
                                           s.segment_rows.data(), s.source_begin.data(), L, N)
                      .local_expert;
    if (l != current) {
      finish_expert();
      current = l;
      mlp = ref::prepare_mlp(&p.gate[size_t(l) * expert_size], &p.up[size_t(l) * expert_size],
                             &p.down[size_t(l) * expert_size], H, I, g.rounding);
      if (backward) acc = std::make_unique<ref::MlpGradAccumulator>(H, I);
    }
    row_ptrs.clear();
    x_ptrs.clear();
    for (int64_t j = 0; j < c.tile_rows; ++j) {
      const int64_t row = tile * c.tile_rows + j;
      const RingRow& r = ring.row(row);
      if (r.source_rank < 0) continue;
      Window& src = *g.windows[size_t(r.source_rank)];
      if (!backward) {
        ref::mlp_row_forward(mlp, ring.x(row), g.rounding, fwd);
        std::copy(fwd.y.begin(), fwd.y.end(), &src.y_slots[size_t(r.slot * H)]);
      } else {
        ref::RowBackward& rb = rows[size_t(j)];
        ref::mlp_row_backward(mlp, ring.x(row), ring.d_out(row), r.weight, g.rounding, rb);
        std::copy(rb.dx.begin(), rb.dx.end(), &src.dx_slots[size_t(r.slot * H)]);
        src.dw_slots[size_t(r.slot)] = rb.d_weight;
        row_ptrs.push_back(&rb);
        x_ptrs.push_back(ring.x(row));
      }
      ++sent[size_t(r.source_rank)];
      delays.maybe_sleep();
    }
    if (backward)
      acc->add_tile(row_ptrs.data(), x_ptrs.data(), int64_t(row_ptrs.size()), g.rounding);
    ring.released(tile).fetch_add(1, std::memory_order_release);
  }
  finish_expert();
  for (int q = 0; q < N; ++q)
    g.windows[size_t(q)]->rows_arrived.fetch_add(sent[size_t(q)], std::memory_order_release);
}

// The rank's own tokens: shared experts, then the fixed-order sums once every routed row is back.
void reduce_own_tokens(Group& g, int rank, const LayerParams& p, bool backward,
                       std::vector<double>& out, LayerGradients* grads) {
  const Config& c = g.config;
  Window& w = *g.windows[size_t(rank)];
  const Batch& b = *w.batch;
  const int64_t T = b.tokens, H = c.hidden, K = c.top_k;
  // Shared experts on the rank's own tokens, while peers may still be combining.
  const ref::Rounding shared_r = g.rounding.for_shared();
  std::vector<double> shared_rows(size_t(T * H), 0.0);
  const bool has_shared = c.shared_width() > 0;
  ref::PreparedMlp shared;
  if (has_shared)
    shared = ref::prepare_mlp(p.shared_gate.data(), p.shared_up.data(), p.shared_down.data(), H,
                              c.shared_width(), shared_r);
  if (has_shared && !backward) {
    ref::RowForward row;
    for (int64_t t = 0; t < T; ++t) {
      ref::mlp_row_forward(shared, &b.x[size_t(t * H)], shared_r, row);
      std::copy(row.y.begin(), row.y.end(), &shared_rows[size_t(t * H)]);
    }
  }
  if (has_shared && backward) {
    ref::shared_backward(shared, shared_r, b.x.data(), w.d_out->data(), T, c.tile_rows,
                         shared_rows.data(), grads->d_params.shared_gate.data(),
                         grads->d_params.shared_up.data(), grads->d_params.shared_down.data());
  }

  bounded_wait(
      g, [&] { return w.rows_arrived.load(std::memory_order_acquire) == T * K; },
      [&] {
        return "its routed rows to come back (" +
               std::to_string(w.rows_arrived.load(std::memory_order_relaxed)) + " of " +
               std::to_string(T * K) + " arrived)";
      });
  if (!backward) {
    ref::combine_rows(g.rounding, T, H, K, shared_rows.data(), w.y_slots.data(),
                      b.topk_weights.data(), out.data());
  } else {
    ref::reduce_input_grads(g.rounding, T, H, K, shared_rows.data(), w.dx_slots.data(),
                            grads->d_x.data());
    grads->d_topk_weights = w.dw_slots;
  }
}

// One rank: schedule (forward only), dispatch + experts, then its own tokens' reduction.
void run_rank(Group& g, int rank, const LayerParams& p, RankSchedule* schedule, bool backward,
              std::vector<double>& out, LayerGradients* grads) {
  const Config& c = g.config;
  Window& w = *g.windows[size_t(rank)];
  const Batch& b = *w.batch;
  Delays delays(g.options, rank, 0);

  if (!backward) {
    const bool scheduled = guarded(g, rank, "schedule", [&] {
      *schedule = build_source_schedule(c, b);
      w.schedule = schedule;
      delays.maybe_sleep();
      w.schedule_ready.store(1, std::memory_order_release);
      for (int q = 0; q < c.ep_size; ++q) {
        std::atomic<uint32_t>& flag = g.windows[size_t(q)]->schedule_ready;
        bounded_wait(
            g, [&] { return flag.load(std::memory_order_acquire) == 1; },
            [&] { return "the expert counts of rank " + std::to_string(q); }, false);
      }
      build_owner_schedule(g, rank, *schedule);
    });
    if (!scheduled) return;
  }

  TokenRing ring(c, backward);
  std::thread producer(
      [&] { guarded(g, rank, "dispatch", [&] { dispatch_role(g, rank, ring, backward); }); });
  guarded(g, rank, "expert",
          [&] { expert_role(g, rank, ring, p, backward, backward ? &grads->d_params : nullptr); });
  producer.join();
  if (g.abort.load(std::memory_order_acquire)) return;
  guarded(g, rank, "combine", [&] { reduce_own_tokens(g, rank, p, backward, out, grads); });
}

void check_group(const Config& c, const std::vector<Batch>& batches,
                 const std::vector<const LayerParams*>& params) {
  c.validate();
  if (batches.size() != size_t(c.ep_size) || params.size() != size_t(c.ep_size)) {
    throw Error(ErrorCode::invalid_argument,
                "the simulation needs one batch and one parameter set per rank (ep_size = " +
                    std::to_string(c.ep_size) + "), got " + std::to_string(batches.size()) +
                    " and " + std::to_string(params.size()));
  }
  for (int r = 0; r < c.ep_size; ++r) {
    Config rc = c;
    rc.ep_rank = r;
    check_batch(rc, batches[size_t(r)]);
    check_params(rc, *params[size_t(r)]);
  }
}

// Runs every rank and turns recorded failures into one error naming each rank's.
void run_group(Group& g, const std::vector<const LayerParams*>& params, SimSchedule& schedule,
               bool backward, std::vector<std::vector<double>>& outs,
               std::vector<LayerGradients>* grads) {
  const int N = g.config.ep_size;
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r) {
    if (r == g.options.absent_rank) continue;  // never arrives
    threads.emplace_back([&, r] {
      run_rank(g, r, *params[size_t(r)], &schedule.ranks[size_t(r)], backward, outs[size_t(r)],
               grads ? &(*grads)[size_t(r)] : nullptr);
    });
  }
  for (std::thread& t : threads) t.join();
  if (g.failures.empty()) return;

  // Report the causes first; ranks that only stopped because of them come last.
  std::stable_sort(g.failures.begin(), g.failures.end(), [](const Failure& a, const Failure& b) {
    return (a.code != ErrorCode::peer_failed) > (b.code != ErrorCode::peer_failed) ||
           ((a.code != ErrorCode::peer_failed) == (b.code != ErrorCode::peer_failed) &&
            a.rank < b.rank);
  });
  std::string message = "EP group of " + std::to_string(N) + " ranks failed:";
  for (const Failure& f : g.failures) message += "\n  " + f.message;
  throw Error(g.failures.front().code, message);
}

std::unique_ptr<Group> make_group(const Config& c, const std::vector<Batch>& batches,
                                  const SimOptions& o, bool backward) {
  auto g = std::make_unique<Group>();
  g->config = c;
  g->options = o;
  g->rounding = ref::Rounding::from(o.numerics);
  for (int r = 0; r < c.ep_size; ++r) {
    auto w = std::make_unique<Window>();
    const Batch& b = batches[size_t(r)];
    w->batch = &b;
    const size_t slots = size_t(b.tokens * c.top_k);
    if (!backward) w->y_slots.assign(slots * size_t(c.hidden), 0.0);
    if (backward) {
      w->dx_slots.assign(slots * size_t(c.hidden), 0.0);
      w->dw_slots.assign(slots, 0.0);
    }
    g->windows.push_back(std::move(w));
  }
  return g;
}

}  // namespace

SimForward simulate_forward(const Config& config, const std::vector<Batch>& batches,
                            const std::vector<const LayerParams*>& params, const SimOptions& o) {
  check_group(config, batches, params);
  auto g = make_group(config, batches, o, false);
  auto schedule = std::make_shared<SimSchedule>();
  schedule->ranks.resize(size_t(config.ep_size));
  SimForward f;
  for (const Batch& b : batches) f.out.emplace_back(size_t(b.tokens * config.hidden));
  run_group(*g, params, *schedule, false, f.out, nullptr);
  f.schedule = schedule;
  return f;
}

std::vector<LayerGradients> simulate_backward(const Config& config,
                                              const std::vector<Batch>& batches,
                                              const std::vector<const LayerParams*>& params,
                                              const SimForward& forward,
                                              const std::vector<std::vector<double>>& d_out,
                                              const SimOptions& o) {
  check_group(config, batches, params);
  if (!forward.schedule || forward.schedule->ranks.size() != size_t(config.ep_size) ||
      d_out.size() != size_t(config.ep_size)) {
    throw Error(ErrorCode::invalid_argument,
                "simulate_backward needs the forward's schedule and one d_out per rank");
  }
  auto g = make_group(config, batches, o, true);
  SimSchedule schedule = *forward.schedule;  // kept from the forward: no count exchange
  std::vector<LayerGradients> grads(size_t(config.ep_size));
  for (int r = 0; r < config.ep_size; ++r) {
    const int64_t T = batches[size_t(r)].tokens;
    if (d_out[size_t(r)].size() != size_t(T * config.hidden)) {
      throw Error(ErrorCode::invalid_argument, "d_out of rank " + std::to_string(r) + " has " +
                                                   std::to_string(d_out[size_t(r)].size()) +
                                                   " elements, expected " +
                                                   std::to_string(T * config.hidden));
    }
    Config rc = config;
    rc.ep_rank = r;
    grads[size_t(r)] = {std::vector<double>(size_t(T * config.hidden)),
                        std::vector<double>(size_t(T * config.top_k)), LayerParams::zeros(rc)};
    Window& w = *g->windows[size_t(r)];
    w.d_out = &d_out[size_t(r)];
    w.schedule = &schedule.ranks[size_t(r)];
    w.schedule_ready.store(1, std::memory_order_release);
  }
  std::vector<std::vector<double>> unused(size_t(config.ep_size));
  run_group(*g, params, schedule, true, unused, &grads);
  return grads;
}

LayerParams slice_params(const Config& c, const LayerParams& all, int ep_size, int rank) {
  const size_t per_rank = size_t(c.num_experts / ep_size);
  const size_t n = size_t(c.intermediate) * size_t(c.hidden);
  const size_t begin = size_t(rank) * per_rank * n, end = begin + per_rank * n;
  LayerParams p{all.shared_gate, all.shared_up, all.shared_down, {}, {}, {}};
  p.gate.assign(all.gate.begin() + long(begin), all.gate.begin() + long(end));
  p.up.assign(all.up.begin() + long(begin), all.up.begin() + long(end));
  p.down.assign(all.down.begin() + long(begin), all.down.begin() + long(end));
  return p;
}

}  // namespace mok
