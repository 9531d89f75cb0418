// Expert placement (DESIGN.md §2, §3): replicate hot experts into redundant physical slots and spread the
// slots over the expert-parallel (EP) ranks of a decode worker, so that no rank becomes the bottleneck.
//
// Terms. A layer has E logical experts and P >= E physical slots; slots [r*P/R, (r+1)*P/R) live on rank r,
// and ranks [n*R/N, (n+1)*R/N) on node n. Each logical expert occupies logcnt >= 1 slots (its replicas) and
// every replica serves an equal share load/logcnt. Experts come in G groups of E/G consecutive ids.
//
// Algorithms.
//  - kDeepSeekHierarchical: the public EPLB algorithm (github.com/deepseek-ai/EPLB, eplb.py,
//    rebalance_experts_hierarchical): pack whole expert groups onto nodes, replicate within each node, then
//    pack the node's physical experts onto its ranks. Reproduces the README example of that repository.
//  - kDeepSeekGlobal: the same with one group and one node (eplb.py's global policy).
//  - kEldr: never puts two replicas of one expert on a rank. Balance first: greedy replication, heaviest-
//    first packing by rounds of R replicas, pairwise balancing passes, then a bottleneck search over swaps and
//    re-replications. Then, without raising any layer's bottleneck: rank contents moved to the nodes where
//    their groups live and swaps that bring replicas to their group's home node (node-aware, not node-forced);
//    given a previous placement, a placement that keeps experts on the ranks that already hold their weights
//    (fewer moves). eldr_placement.cc describes the steps.
//
// Tie rule of the DeepSeek variants (eplb.py uses torch sort/max): (1) "heaviest first" is a stable sort
// by descending load, so equal loads keep ascending index order; (2) "lightest non-full pack" takes the
// lowest pack index among equal pack loads; (3) "the expert with the highest load per replica" takes the
// lowest (node-local) index among equal values, as torch.max does. Loads and shares are compared in
// double precision (eplb.py converts to float32), so values that tie or nearly tie in float32 can order
// differently from eplb.py; the README example (integer loads) reproduces exactly.
//
// Thread safety: every function is reentrant; nothing is shared between calls (Place with kEldr starts
// worker threads of its own and joins them before it returns; see Performance below).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

struct PlacementProblem {
  int num_layers = 0;        // L
  int num_experts = 0;       // E, logical experts per layer
  std::vector<double> load;  // [L, E], finite and >= 0, any unit (tokens, fractions of tokens)
  int num_slots = 0;         // P = E + redundant physical slots per layer; P % R == 0
  int num_ranks = 0;         // R, EP ranks (GPUs); R % N == 0
  int num_nodes = 1;         // N, nodes the ranks are spread over (fast links inside a node)
  int num_groups = 1;        // G, expert groups of E/G consecutive experts; E % G == 0
  // kEldr with a previous placement: each layer's bottleneck (most loaded rank) may exceed the one placed
  // without the previous placement by this fraction, to move fewer experts. 0 = never trade balance.
  double move_slack = 0.0;
};

struct Placement {
  int num_layers = 0;
  int num_experts = 0;
  int num_slots = 0;
  int num_ranks = 0;
  int max_replicas = 0;          // max over the whole placement of logcnt
  std::vector<int32_t> phy2log;  // [L, P], logical expert in each physical slot
  std::vector<int32_t> log2phy;  // [L, E, max_replicas], slots of each expert, -1 padded
  std::vector<int32_t> logcnt;   // [L, E], replicas of each expert, >= 1, summing to P in a layer

  int slots_per_rank() const { return num_ranks > 0 ? num_slots / num_ranks : 0; }
};

enum class PlacementAlgorithm { kDeepSeekGlobal, kDeepSeekHierarchical, kEldr };

// The largest EP group eldr places and reads placements for (`eldr place` -R/-N and -P, /placement of
// calibration.h5, decode.ep_size of a job). The largest public decode EP group is 320 ranks (DeepSeek-V3), the largest
// expert count 384 (Kimi K2): these leave room for 3x and 85x that, and keep one layer's kEldr placement within
// seconds (at P = 32768 and R = 1024, 0.1-0.8 s on a 2-core VM for synthetic loads, 5 s for a calibration cluster's
// load of E = 2048; twice either bound costs 3-5x that).
inline constexpr int kMaxPlacementRanks = 1024;
inline constexpr int kMaxPlacementSlots = 32768;

// Optional observation and cancellation of a long Place call (the command line's progress bar and Ctrl-C).
struct PlaceHooks {
  // Called before each layer, from any of Place's threads (so it must be thread-safe), and for kEldr also every few
  // dozen moves of its bottleneck search (where a large layer spends its time; at most about a second apart at the
  // command line's bounds). A non-OK status stops the placement: no layer starts after it, a layer in progress is
  // left unfinished, and Place returns that status once its threads have stopped.
  std::function<Status()> check;
  // Called after each layer with the number of layers placed so far; Place never makes two calls at once.
  std::function<void(int layers_done)> on_layer;
};

// "deepseek-global", "deepseek-hierarchical" or "eldr"; InvalidArgument naming the choices otherwise.
Result<PlacementAlgorithm> ParsePlacementAlgorithm(const std::string& name);
const char* PlacementAlgorithmName(PlacementAlgorithm algorithm);

// Places every layer of `problem`. InvalidArgument (naming the values) if a count is < 1, load is not
// [L, E] or has a negative or non-finite value, P < E, P % R != 0, R % N != 0, E % G != 0; for
// kDeepSeekHierarchical also G % N != 0; for kEldr also P/R > E (a rank could not avoid holding two
// replicas of one expert) or a `previous` of another shape. ResourceExhausted (runtime/common/memory_budget.h)
// when PlacementMemoryBytes (64 MiB or more) exceeds the memory this process may still allocate, before anything
// is allocated, and likewise log2phy once its width (the largest replica count) is known.
// `hooks` (optional): see PlaceHooks; a failed check is returned as it is.
// `previous` (optional, kEldr only; the DeepSeek variants follow the public algorithm and ignore it):
// the placement in service now. kEldr then looks for a placement that moves fewer expert weights
// (CountMoves) while no layer's bottleneck exceeds (1 + move_slack) times the one it reaches without
// `previous`. A layer of `previous` that already meets that cap under the new load with its own replica counts
// (every expert placed, none twice on a rank) is kept as it is (zero moves): in particular when the load is
// unchanged and `previous` came from kEldr with the same move_slack, a fresh placement or a re-plan alike.
// InvalidArgument if move_slack is negative or not finite.
// Layers with zero total load are valid: the DeepSeek variants behave as eplb.py does (every redundant
// slot goes to expert 0 of the node), kEldr spreads redundant slots over distinct experts.
// log2phy order: DeepSeek variants list replicas in eplb.py's replica-rank order (the original slot
// first, then redundant copies in the order they were created); kEldr lists slots in ascending order.
// Performance. Per layer, the DeepSeek variants take O(E log E + P log R). kEldr sorts the experts once by one
// counting pass and an insertion sort within buckets (O(E) plus the pairs of keys within ~6 % of each other,
// O(E^2) at worst) and keeps that order while it replicates (O((P - E) * E) at worst); it packs in P/R rounds of
// R replicas, each after a branch-free O(R^2) rank sort, and runs two pairwise balancing passes of
// O(R^2 + P * P/R) (the i-th heaviest and the i-th lightest rank, their P/R x P/R replica pairs); its bottleneck
// search sorts the ranks by O(R^2) branch-free comparisons and reads the slots' loads (O(P)) at the start of each
// round, then makes at most 4P swaps of O(P * P/R) each (the P/R x P/R replica pairs of the most loaded rank with
// each lighter rank; a branch-free O((P/R)^2) test, eight replicas at a time, skips a rank that cannot take a swap,
// and the replicas of the most loaded rank are scanned by ascending load, so a pair scan stops at the first that
// would lift the lighter rank to the limit) and at most 32 re-replication rounds, each first a necessary test of
// O(E + P/R * (R + P/R * replicas)) (placement_internal.h, ReplicationMayImprove) and only where it does not prove
// that no move exists a search of O(P * (P + E)) (experts whose best case already fails a bound are skipped). A
// layer more than 2 % above its lower bound gets one more balancing pass and search, then a start packed one
// replica at a time (O(E log E + P * R)) with its own search. The node steps take O(R log R + P^2); a previous
// placement adds O(R * E + N * (R/N)^3 + N^3) and at most two more starts of the packing's and search's cost.
// The searches end as soon as no move improves, far from those bounds: on the benchmark case below a layer
// takes about 16 swaps after the balancing passes (22 before them) and one re-replication test. Scratch buffers
// are allocated once per thread. kEldr places the layers on up to DefaultThreads() threads (ELDR_NUM_THREADS,
// runtime/common/parallel.h), one per 16 layers or more, the calling thread among them; the result does not
// depend on the number of threads. Measured (bench/placement_bench, BM_Place: 94 layers x 128 experts into 160
// slots on 32 ranks in 4 nodes): DeepSeek variants about 1-2 ms; kEldr 2.62 ms single-threaded on a quiet 2-core
// VM after three rounds of bit-identical speed-ups, 0.92-0.94x of that after a fifth, then about 0.75-0.85x of
// that CPU time with the packing by rounds and the balancing passes (bench/README.md, "Expert placement", sixth
// round), then about 0.75-0.8x of that with the bit-identical speed-ups of the seventh round: about 1.4-1.6 ms
// projected, so the <= 1 ms target of issue 15 is not met on one thread. With the default two threads on a quiet
// 2-core VM (stop 31) 0.97-1.00 ms, then ~0.95x of that with log2phy written by the calling thread while the
// other finishes its last layers.
Result<Placement> Place(const PlacementProblem& problem, PlacementAlgorithm algorithm,
                        const Placement* previous = nullptr, const PlaceHooks* hooks = nullptr);

// The bytes Place allocates for `problem` before it knows the replica counts: phy2log and logcnt of the result and the
// scratch of all its threads, an upper bound up to small vectors (log2phy, whose width is known only after placing,
// is checked then; the load and `previous` are the caller's). A double, so that a product of counts cannot overflow.
// REQUIRES: counts >= 1.
double PlacementMemoryBytes(const PlacementProblem& problem, PlacementAlgorithm algorithm, bool with_previous);

// DESIGN.md §3: Σ_layers mean-over-ranks load ÷ Σ_layers max-over-ranks load, where rank r holds slots
// [r*P/R, (r+1)*P/R) and each slot of expert e carries load[l, e] / logcnt[l, e]. 1.0 = perfect; also 1.0
// when the load is zero everywhere. load: [L, E]. REQUIRES: a placement returned by Place (or
// PlacementFromPhy2Log) with the same L and E as `load`.
double Balancedness(const Placement& placement, const std::vector<double>& load);

// The rank loads behind Balancedness, for one load [L, E] (e.g. the activations of one decode step): rank r
// holds slots [r*P/R, (r+1)*P/R) and each slot of expert e carries load[l, e] / logcnt[l, e].
struct RankLoadSummary {
  int num_layers = 0;
  double sum_mean_rank_load = 0;  // Σ_layers mean-over-ranks load
  double sum_max_rank_load = 0;   // Σ_layers max-over-ranks load
  // DESIGN.md §3: Σ mean ÷ Σ max, in (0, 1]; 1.0 when the load is zero everywhere.
  double balancedness() const { return sum_max_rank_load > 0 ? sum_mean_rank_load / sum_max_rank_load : 1.0; }
  // The most loaded rank's load, averaged over layers (same unit as the load).
  double mean_max_rank_load() const { return num_layers > 0 ? sum_max_rank_load / num_layers : 0.0; }
  // A rank's load if the layer were perfectly balanced, averaged over layers.
  double mean_rank_load() const { return num_layers > 0 ? sum_mean_rank_load / num_layers : 0.0; }
};
// load: [L, E]. REQUIRES: as for Balancedness. Reentrant; allocates nothing.
RankLoadSummary SummarizeRankLoad(const Placement& placement, const double* load);

// The placement of an EP group when nothing is placed: no redundant slots (P = E) and expert e on rank
// e / (E/R) in every layer. InvalidArgument naming E and R unless L, E, R >= 1 and E % R == 0.
Result<Placement> ContiguousPlacement(int num_layers, int num_experts, int num_ranks);

// How much of each group's load is served on one node: Σ_{l,g} max_n served(l, g, n) ÷ Σ_{l,g} load(l, g),
// where served(l, g, n) is the load of group g's replicas on node n. 1.0 = every group on one node (as
// kDeepSeekHierarchical guarantees); 1.0 also when the load is zero. REQUIRES: E % G == 0, R % N == 0.
double GroupLocality(const Placement& placement, const std::vector<double>& load, int num_groups, int num_nodes);

struct MoveStats {
  int64_t moved_experts = 0;  // expert weights that must be copied onto a rank that does not hold them
  double moved_bytes = 0;     // moved_experts * expert_bytes (a double: the product can pass 2^63)
  int64_t changed_slots = 0;  // slots whose logical expert differs (includes reorders within a rank)
};
// moved_experts = Σ_{layer, rank, expert} max(0, replicas on the rank in `to` − replicas there in `from`):
// reordering slots inside a rank is a local copy and is not counted as a move.
// REQUIRES: same num_layers, num_experts, num_slots and num_ranks.
MoveStats CountMoves(const Placement& from, const Placement& to, int64_t expert_bytes = 0);

// Rebuilds logcnt and log2phy (ascending slots) from phy2log [L, P], e.g. a placement read from a file.
// InvalidArgument if a value is outside [0, E), an expert has no slot, or P % R != 0.
Result<Placement> PlacementFromPhy2Log(int num_layers, int num_experts, int num_ranks, std::vector<int32_t> phy2log);

// Load readers. Both return [L, E] row-major and set *num_layers and *num_experts.
// JSON as in the expert-load profiles (bench/data/expert-load-profiles): {"token_scores": {"<layer>":
// {"<expert>": value}}, "gate_scores": {...}}; `member` names the one read, "token_scores" or "gate_scores"
// (InvalidArgument otherwise), and both members, where present, are checked alike. Layers are the member's keys in
// ascending numeric order (ids need not start at 0, but must be consecutive: a gap is Corrupt naming the missing
// layer); E is one more than the largest
// expert key of any layer, and every layer must have the experts 0..E-1 (a lacking one is Corrupt naming it). All-zero
// layers are kept. Loads must be finite, >= 0 and sum to at most 1e300 (InvalidArgument), for both readers. NotFound /
// Corrupt / InvalidArgument with the path in the message; ResourceExhausted before the file is read when 17 bytes per
// byte of it (its text and DOM) exceed the memory budget (runtime/common/memory_budget.h).
Result<std::vector<double>> ReadLoadJson(const std::string& path, const std::string& member, int* num_layers,
                                         int* num_experts);
// A 2-D numeric dataset [L, E] of an HDF5 file, e.g. "/load", with 1 <= L, E <= 65535; the declared shape is
// checked before anything is read (InvalidArgument naming the shape), and the read against the memory budget.
Result<std::vector<double>> ReadLoadHdf5(const std::string& path, const std::string& dataset, int* num_layers,
                                         int* num_experts);

}  // namespace eldr
