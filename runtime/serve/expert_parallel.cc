#include "runtime/serve/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "kernels/backend.h"
#include "runtime/calib/placement_store.h"
#include "runtime/common/check.h"

namespace eldr {

Result<Placement> LoadDecoderPlacement(const JobConfig& c, const ModelConfig& mc, int decoder) {
  const int L = mc.num_moe_layers(), E = mc.num_experts, G = c.ep_size;
  if (c.placement == "contiguous") {
    auto p = ContiguousPlacement(L, E, G);
    if (!p.ok()) {
      return Status::InvalidArgument(c.path +
                                     ": decode.placement contiguous puts E/G experts on each EP rank, but the "
                                     "model has E = " +
                                     std::to_string(E) + " experts and decode.ep_size is " + std::to_string(G) +
                                     "; choose an ep_size that divides " + std::to_string(E) +
                                     " or a placement file (eldr place calib)");
    }
    return p;
  }
  const std::string& path = c.placement;
  // Every failure is a config error: InvalidArgument, so that it is printed once (by rank 0).
  auto bad = [&](const std::string& m) { return Status::InvalidArgument(path + ": " + m); };
  if (!std::filesystem::exists(path)) {
    return Status::InvalidArgument(c.path + ": decode.placement " + path +
                                   ": no such file (give contiguous or a calibration.h5 with /placement)");
  }
  // calib/placement_store.h: decoder k serves cluster k; its placement is cluster_k, else global.
  auto stored = ReadPlacements(path, L, E, decoder, decoder + 1);
  if (!stored.ok()) return Status::InvalidArgument(stored.status().message());
  if (!stored.value().present) {
    return bad("no /placement to use as decode.placement; run eldr place calib --calib " + path + " --ranks " +
               std::to_string(G) + " --slots P");
  }
  if (stored.value().num_ranks != G) {
    return bad("/placement is for " + std::to_string(stored.value().num_ranks) + " EP ranks but decode.ep_size is " +
               std::to_string(G) + " (" + c.path + "); re-run eldr place calib with --ranks " + std::to_string(G));
  }
  return std::move(stored.value().per_cluster[0]);
}

EpDispatchPlan PlanDispatch(const Placement& pl, int l, const int32_t* topk_ids, int T, int K) {
  const int E = pl.num_experts, P = pl.num_slots, G = pl.num_ranks, R = pl.max_replicas;
  const int slots_per_rank = P / G;
  ELDR_CHECK(l >= 0 && l < pl.num_layers, "MoE layer " << l << " outside the placement's " << pl.num_layers);
  const int n = T * K;
  EpDispatchPlan plan;
  plan.slot.resize(n);
  std::vector<int32_t> seen(E, 0), per_slot(P + 1, 0);
  for (int p = 0; p < n; ++p) {
    const int e = topk_ids[p];
    ELDR_CHECK(e >= 0 && e < E, "expert id " << e << " out of range");
    const size_t le = static_cast<size_t>(l) * E + e;
    const int replica = seen[e]++ % pl.logcnt[le];  // round-robin over e's replicas in pair order
    const int32_t s = pl.log2phy[le * R + replica];
    ELDR_CHECK(s >= 0 && s < P, "log2phy slot " << s << " of expert " << e << " at layer " << l);
    plan.slot[p] = s;
    ++per_slot[s + 1];
  }
  // Stable counting sort by slot: ranks hold consecutive slots, so this also orders by rank.
  for (int s = 0; s < P; ++s) per_slot[s + 1] += per_slot[s];
  plan.order.resize(n);
  std::vector<int32_t> cursor(per_slot.begin(), per_slot.end() - 1);
  for (int p = 0; p < n; ++p) plan.order[cursor[plan.slot[p]]++] = p;
  plan.rows_per_rank.assign(G, 0);
  plan.offset.assign(G + 1, 0);
  for (int r = 0; r < G; ++r) {
    plan.offset[r + 1] = per_slot[(r + 1) * slots_per_rank];
    plan.rows_per_rank[r] = plan.offset[r + 1] - plan.offset[r];
  }
  return plan;
}

namespace {

// The fixed part of a layer header; the rows of each EP rank follow ([G] int64).
enum HeaderField { kCommand, kLayer, kMoeLayer, kHidden, kBatchInvariant, kPlacementHash, kHeaderFixed };
enum Command : int64_t { kStop = 0, kRunLayer = 1 };

// FNV-1a over the placement's shape and phy2log: every rank of a group must have loaded the same placement.
int64_t PlacementHash(const Placement& pl) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](int64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((static_cast<uint64_t>(v) >> (8 * b)) & 0xff)) * 1099511628211ULL;
  };
  mix(pl.num_layers);
  mix(pl.num_experts);
  mix(pl.num_slots);
  mix(pl.num_ranks);
  for (int32_t v : pl.phy2log) mix(v);
  return static_cast<int64_t>(h >> 1);
}

// SwiGLU of rows grouped by physical slot: x [n, H] (rows of equal slot consecutive), y [n, H]. Each run of one
// slot is one ExpertFfn call on the logical expert in that slot.
void ComputeSlotRuns(const ModelWeights& w, const Placement& pl, int layer, int moe_layer, const int32_t* slots,
                     const float* x, int64_t n, bool batch_invariant, float* y, kernels::Backend& compute,
                     kernels::Stream& stream) {
  const int H = w.config.hidden_size;
  const int32_t* phy2log = pl.phy2log.data() + static_cast<size_t>(moe_layer) * pl.num_slots;
  for (int64_t begin = 0; begin < n;) {
    int64_t end = begin + 1;
    while (end < n && slots[end] == slots[begin]) ++end;
    compute.ExpertFfn({x + begin * H, static_cast<int>(end - begin), &w.layers[layer].experts, phy2log[slots[begin]],
                       y + begin * H, batch_invariant},
                      stream);
    begin = end;
  }
}

// The rows of a group travel through host memory (MPI on the host).
void CheckHostCompute(const kernels::Backend& compute) {
  ELDR_CHECK(compute.host_memory(), "EP groups exchange rows through host memory; the '"
                                        << compute.name() << "' compute backend is not supported here yet");
}

void CheckGroup(const ModelWeights& w, const Placement& pl, const GroupComm& group) {
  ELDR_CHECK(group.valid() && group.size() == pl.num_ranks,
             "EP group of " << group.size() << " ranks for a placement on " << pl.num_ranks);
  ELDR_CHECK(pl.num_layers == w.config.num_moe_layers() && pl.num_experts == w.config.num_experts,
             "placement [" << pl.num_layers << " layers, " << pl.num_experts << " experts] for another model");
}

}  // namespace

EpExpertBackend::EpExpertBackend(const ModelWeights& weights, const Placement& placement, GroupComm& group,
                                 kernels::Backend& compute)
    : w_(weights),
      placement_(placement),
      group_(group),
      compute_(compute),
      stream_(compute.CreateStream()),
      placement_hash_(PlacementHash(placement)) {
  CheckGroup(w_, placement_, group_);
  CheckHostCompute(compute_);
  ELDR_CHECK(group_.rank() == 0, "the EP backend runs on the group's leader");
  step_.rank_load.assign(group_.size(), 0);
}

Status EpExpertBackend::RunExperts(const MoeLayerCall& call) {
  const int G = group_.size(), H = w_.config.hidden_size, T = call.num_tokens, K = call.top_k;
  // The compute memory is host memory (CheckHostCompute), so call.topk_ids is readable when no copy is given.
  const int32_t* host_ids = call.host_topk_ids ? call.host_topk_ids : call.topk_ids;
  kernels::Stream& stream = call.stream ? *call.stream : *stream_;
  const EpDispatchPlan plan = PlanDispatch(placement_, call.moe_layer, host_ids, T, K);
  std::vector<int64_t> header(kHeaderFixed + G);
  header[kCommand] = kRunLayer;
  header[kLayer] = call.layer;
  header[kMoeLayer] = call.moe_layer;
  header[kHidden] = H;
  header[kBatchInvariant] = call.batch_invariant ? 1 : 0;
  header[kPlacementHash] = placement_hash_;
  std::copy(plan.rows_per_rank.begin(), plan.rows_per_rank.end(), header.begin() + kHeaderFixed);
  group_.Bcast(header.data(), header.size() * sizeof(int64_t), 0);

  // Dispatch: member r gets records {int32 slot, float x[H]} of its rows, in plan order.
  const int64_t record = sizeof(int32_t) + static_cast<int64_t>(H) * sizeof(float);
  const int64_t remote_rows = plan.offset[G] - plan.offset[1];
  std::vector<uint8_t> send(static_cast<size_t>(remote_rows * record));
  std::vector<int64_t> zeros(G, 0), send_bytes(G, 0), send_offsets(G, 0);
  for (int r = 1; r < G; ++r) {
    send_bytes[r] = plan.rows_per_rank[r] * record;
    send_offsets[r] = (plan.offset[r] - plan.offset[1]) * record;
  }
  for (int64_t i = plan.offset[1]; i < plan.offset[G]; ++i) {
    const int p = plan.order[i];
    uint8_t* rec = send.data() + (i - plan.offset[1]) * record;
    std::memcpy(rec, &plan.slot[p], sizeof(int32_t));
    std::memcpy(rec + sizeof(int32_t), call.x + static_cast<size_t>(p / K) * H, H * sizeof(float));
  }
  uint8_t dummy = 0;
  group_.Alltoallv(send.empty() ? &dummy : send.data(), send_bytes, send_offsets, &dummy, zeros, zeros);

  // The leader's own rows, while the members compute theirs.
  std::vector<float> y(static_cast<size_t>(T) * K * H);
  const int64_t own = plan.rows_per_rank[0];
  {
    std::vector<float> xin(static_cast<size_t>(own) * H), yout(static_cast<size_t>(own) * H);
    std::vector<int32_t> slots(own);
    for (int64_t i = 0; i < own; ++i) {
      const int p = plan.order[i];
      slots[i] = plan.slot[p];
      std::memcpy(xin.data() + i * H, call.x + static_cast<size_t>(p / K) * H, H * sizeof(float));
    }
    ComputeSlotRuns(w_, placement_, call.layer, call.moe_layer, slots.data(), xin.data(), own, call.batch_invariant,
                    yout.data(), compute_, stream);
    for (int64_t i = 0; i < own; ++i) {
      std::memcpy(y.data() + static_cast<size_t>(plan.order[i]) * H, yout.data() + i * H, H * sizeof(float));
    }
  }

  // Combine: the members' output rows come back in the order they were sent.
  std::vector<float> recv(static_cast<size_t>(remote_rows) * H);
  std::vector<int64_t> recv_bytes(G, 0), recv_offsets(G, 0);
  for (int r = 1; r < G; ++r) {
    recv_bytes[r] = plan.rows_per_rank[r] * H * static_cast<int64_t>(sizeof(float));
    recv_offsets[r] = (plan.offset[r] - plan.offset[1]) * H * static_cast<int64_t>(sizeof(float));
  }
  group_.Alltoallv(&dummy, zeros, zeros, recv.empty() ? static_cast<void*>(&dummy) : recv.data(), recv_bytes,
                   recv_offsets);
  for (int64_t i = plan.offset[1]; i < plan.offset[G]; ++i) {
    std::memcpy(y.data() + static_cast<size_t>(plan.order[i]) * H, recv.data() + (i - plan.offset[1]) * H,
                H * sizeof(float));
  }
  compute_.MoeCombine({y.data(), call.topk_weights, T, K, H, call.out}, stream);

  int64_t max_rows = 0;
  for (int r = 0; r < G; ++r) {
    step_.rank_load[r] += plan.rows_per_rank[r];
    max_rows = std::max(max_rows, plan.rows_per_rank[r]);
  }
  step_.sum_mean += static_cast<double>(T) * K / G;
  step_.sum_max += static_cast<double>(max_rows);
  return Status::Ok();
}

void EpExpertBackend::StopMembers() {
  std::vector<int64_t> header(kHeaderFixed + group_.size(), 0);
  header[kCommand] = kStop;
  group_.Bcast(header.data(), header.size() * sizeof(int64_t), 0);
}

EpStepLoad EpExpertBackend::TakeStepLoad() {
  EpStepLoad out = std::move(step_);
  step_ = EpStepLoad();
  step_.rank_load.assign(group_.size(), 0);
  return out;
}

Status RunEpMember(const ModelWeights& w, const Placement& pl, GroupComm& group, kernels::Backend& compute) {
  CheckGroup(w, pl, group);
  CheckHostCompute(compute);
  const std::unique_ptr<kernels::Stream> stream = compute.CreateStream();
  ELDR_CHECK(group.rank() > 0, "RunEpMember on the group's leader");
  const int G = group.size(), me = group.rank(), H = w.config.hidden_size;
  const int slots_per_rank = pl.slots_per_rank();
  const int64_t hash = PlacementHash(pl);
  const int64_t record = sizeof(int32_t) + static_cast<int64_t>(H) * sizeof(float);
  std::vector<int64_t> header(kHeaderFixed + G), zeros(G, 0), bytes(G, 0);
  std::vector<uint8_t> recv;
  std::vector<float> x, y;
  std::vector<int32_t> slots;
  uint8_t dummy = 0;
  while (true) {
    group.Bcast(header.data(), header.size() * sizeof(int64_t), 0);
    if (header[kCommand] == kStop) return Status::Ok();
    ELDR_CHECK(header[kCommand] == kRunLayer, "EP header with command " << header[kCommand]);
    if (header[kPlacementHash] != hash || header[kHidden] != H) {
      return Status::FailedPrecondition("EP rank " + std::to_string(me) +
                                        ": the leader's placement or model differs from this rank's");
    }
    const int layer = static_cast<int>(header[kLayer]), moe_layer = static_cast<int>(header[kMoeLayer]);
    ELDR_CHECK(layer >= 0 && layer < w.config.num_hidden_layers && moe_layer >= 0 && moe_layer < pl.num_layers,
               "EP header for layer " << layer << " (MoE layer " << moe_layer << ")");
    const int64_t rows = header[kHeaderFixed + me];
    recv.resize(static_cast<size_t>(rows * record));
    bytes[0] = rows * record;
    group.Alltoallv(&dummy, zeros, zeros, recv.empty() ? &dummy : recv.data(), bytes, zeros);
    slots.resize(rows);
    x.resize(static_cast<size_t>(rows) * H);
    y.resize(static_cast<size_t>(rows) * H);
    for (int64_t i = 0; i < rows; ++i) {
      const uint8_t* rec = recv.data() + i * record;
      std::memcpy(&slots[i], rec, sizeof(int32_t));
      ELDR_CHECK(slots[i] / slots_per_rank == me, "EP rank " << me << " got a row of slot " << slots[i]
                                                             << ", which lives on rank " << slots[i] / slots_per_rank);
      std::memcpy(x.data() + i * H, rec + sizeof(int32_t), H * sizeof(float));
    }
    ComputeSlotRuns(w, pl, layer, moe_layer, slots.data(), x.data(), rows, header[kBatchInvariant] != 0, y.data(),
                    compute, *stream);
    bytes[0] = rows * H * static_cast<int64_t>(sizeof(float));
    group.Alltoallv(y.empty() ? static_cast<void*>(&dummy) : y.data(), bytes, zeros, &dummy, zeros, zeros);
  }
}

}  // namespace eldr
