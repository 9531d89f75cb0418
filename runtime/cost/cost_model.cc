#include "runtime/cost/cost_model.h"

#include <Eigen/Dense>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "runtime/common/atomic_file.h"
#include "runtime/common/check.h"
#include "runtime/common/json_util.h"
#include "runtime/common/yaml.h"

namespace eldr {

namespace fs = std::filesystem;

namespace {

// Every coefficient, where it lives in the YAML and its valid values (cost_model.h).
struct Key {
  const char* section;
  const char* name;
  double CostModel::*field;
  NumberRange range;
};
const Key kKeys[] = {
    {"decode", "a", &CostModel::decode_a, kCostSeconds},
    {"decode", "b", &CostModel::decode_b, kCostSeconds},
    {"decode", "c", &CostModel::decode_c, kCostSeconds},
    {"decode", "d", &CostModel::decode_d, kCostSeconds},
    {"prefill", "a", &CostModel::prefill_a, kCostSeconds},
    {"prefill", "b", &CostModel::prefill_b, kCostSeconds},
    {"kv_transfer", "latency_s", &CostModel::kv_latency, kCostSeconds},
    {"kv_transfer", "bandwidth_Bps", &CostModel::kv_bandwidth, kLinkBandwidth},
    {"", "control_latency_s", &CostModel::control_latency, kCostSeconds},
    {"", "cores", &CostModel::cores, kCores},
};

// Applies the keys present in `y` to `m`, against the cost model's schema; `required`: every coefficient of
// decode: and prefill: must be given (a cost model file, or a simulate: section without a cost_model file), so
// that a missing or misspelled section fails instead of costing nothing. `job_keys`: y is a job config's
// simulate: section, which also names its cost_model file.
Status ApplyYaml(const YAML::Node& y, const std::string& where, bool required, bool job_keys, CostModel* m) {
  YamlMap root(where, y, job_keys ? "simulate" : "");
  if (job_keys) root.Allow("cost_model");
  root.Get("name", &m->name);
  root.Get("source", &m->source);
  for (const Key& k : kKeys) {
    YamlMap& section = *k.section ? root.Section(k.section) : root;
    const bool must = required && (std::string(k.section) == "decode" || std::string(k.section) == "prefill");
    if (must && *k.section && !root.Has(k.section)) {
      root.Require(k.section);
    } else if (must) {
      section.Require(k.name);
    }
    section.Get(k.name, &(m->*k.field), k.range);
  }
  return root.Finish();
}

int64_t DtypeBytes(const ModelConfig& m) { return m.torch_dtype == "bfloat16" ? 2 : 4; }

// K and V of one token over all attention layers.
double KvBytesPerToken(const ModelConfig& m) {
  return 2.0 * m.num_hidden_layers * m.num_key_value_heads * m.head_dim * static_cast<double>(DtypeBytes(m));
}

// Solves unconstrained least squares on the given columns; the others are 0.
std::vector<double> SubsetLeastSquares(const std::vector<double>& x, const std::vector<double>& y, int cols,
                                       unsigned mask) {
  const int rows = static_cast<int>(y.size());
  std::vector<int> use;
  for (int j = 0; j < cols; ++j) {
    if (mask & (1u << j)) use.push_back(j);
  }
  std::vector<double> beta(cols, 0.0);
  if (use.empty()) return beta;
  Eigen::MatrixXd A(rows, static_cast<int>(use.size()));
  Eigen::VectorXd b(rows);
  for (int i = 0; i < rows; ++i) {
    for (size_t j = 0; j < use.size(); ++j) A(i, static_cast<int>(j)) = x[static_cast<size_t>(i) * cols + use[j]];
    b(i) = y[i];
  }
  const Eigen::VectorXd s = A.completeOrthogonalDecomposition().solve(b);
  for (size_t j = 0; j < use.size(); ++j) beta[use[j]] = s(static_cast<int>(j));
  return beta;
}

// One term of a fitted model: its coefficient, what the coefficient costs, and the feature it multiplies (its
// column of the design). `plural`: the feature reads as a plural ("the distinct experts vary").
struct FitTerm {
  const char* coefficient;
  const char* unit;
  const char* feature;
  bool plural;
};
const FitTerm kDecodeTerms[] = {{"decode.a", "s per step", "1", false},
                                {"decode.b", "s per distinct expert", "distinct experts", true},
                                {"decode.c", "s per sequence", "batch", false},
                                {"decode.d", "s per context token", "context tokens", true}};
const FitTerm kPrefillTerms[] = {{"prefill.a", "s per prefill", "1", false},
                                 {"prefill.b", "s per computed prompt token", "computed prompt tokens", true}};
const FitTerm kLayerTerms[] = {{"decode.a", "s per step", "1", false},
                               {"decode.b", "s per distinct expert", "distinct experts", true},
                               {"decode.c", "s per sequence", "batch", false}};

// A column whose part outside the span of the columns before it is below this fraction of its norm is taken for a
// combination of them. Exact collinearity in integer step features leaves ~1e-15; one step in 10^5 off a relation
// by one expert leaves ~1e-6 and is still fitted (the within-batch diagnostic says how well b is then identified).
constexpr double kCollinearTolerance = 1e-7;

std::string FormatCoefficient(double v) {
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

// "A, B and C"
std::string JoinWords(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) s += (i == 0 ? "" : i + 1 == words.size() ? " and " : ", ") + words[i];
  return s;
}

using RowMajorMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The part of column j of X outside the span of the columns `kept`, as a fraction of column j's norm (1 when `kept`
// is empty; a zero column is entirely inside every span). *w: column j's least-squares weights on `kept`.
double OutsideSpan(const Eigen::Ref<const RowMajorMatrix>& X, const std::vector<int>& kept, int j, Eigen::VectorXd* w) {
  const Eigen::VectorXd column = X.col(j);
  *w = Eigen::VectorXd::Zero(static_cast<int>(kept.size()));
  if (column.norm() == 0) return 0;
  if (kept.empty()) return 1;
  Eigen::MatrixXd A(X.rows(), static_cast<int>(kept.size()));
  for (size_t k = 0; k < kept.size(); ++k) A.col(static_cast<int>(k)) = X.col(kept[k]);
  *w = A.completeOrthogonalDecomposition().solve(column);
  return (column - A * *w).norm() / column.norm();
}

// The refusal of a design whose column j is Σ_k w_k · column kept[k] (InvalidArgument, one line): the coefficients that
// take part (a negligible weight does not), the relation, and the samples that would separate them.
Status CollinearDesign(const Eigen::Ref<const RowMajorMatrix>& X, const FitTerm* terms, const std::vector<int>& kept,
                       int j, const Eigen::VectorXd& w, const std::string& what) {
  std::vector<int> involved{j};
  std::vector<std::string> coefficients, others;
  std::string relation;
  for (size_t k = 0; k < kept.size(); ++k) {
    const int i = kept[k];
    const double weight = w(static_cast<int>(k));
    if (std::abs(weight) * X.col(i).norm() <= 1e-9 * X.col(j).norm()) continue;
    involved.push_back(i);
    const std::string value = FormatCoefficient(std::abs(weight));
    const bool constant = std::string(terms[i].feature) == "1";
    const std::string part = constant ? value : (value == "1" ? "" : value + "·") + terms[i].feature;
    relation += (relation.empty() ? (weight < 0 ? "-" : "") : (weight < 0 ? " - " : " + ")) + part;
    if (!constant) others.push_back(terms[i].feature);
  }
  std::sort(involved.begin(), involved.end());
  for (int i : involved) coefficients.push_back(std::string(terms[i].coefficient) + " (" + terms[i].unit + ")");
  const std::string told = coefficients.size() == 1   ? "cannot identify " + coefficients[0]
                           : coefficients.size() == 2 ? "cannot tell " + coefficients[0] + " from " + coefficients[1]
                                                      : "cannot tell " + JoinWords(coefficients) + " apart";
  const FitTerm& t = terms[j];
  return Status::InvalidArgument(
      "the " + what + " " + told + ": " + t.feature + " = " + (relation.empty() ? "0" : relation) + " in all " +
      std::to_string(X.rows()) +
      " of them (a collinear design: every split between these terms fits equally well); add " + what + " where the " +
      t.feature + (t.plural ? " vary" : " varies") + (others.empty() ? "" : " at a fixed " + JoinWords(others)) +
      (std::string(t.feature) == "distinct experts" ? " (e.g. same-domain and mixed batches of one size)" : ""));
}

// OK when least squares on x [rows, cols] identifies every coefficient: the columns, taken in `order`, must each keep
// more than kCollinearTolerance of their norm outside the span of those before them (a QR in a fixed order with a
// relative tolerance; the order puts last the feature the message writes in terms of the others). Otherwise
// CollinearDesign's line. `what`: the samples ("decode steps").
Status CheckIdentifiable(const std::vector<double>& x, int cols, const FitTerm* terms, const std::vector<int>& order,
                         const std::string& what) {
  const Eigen::Map<const RowMajorMatrix> X(x.data(), static_cast<Eigen::Index>(x.size() / cols), cols);
  std::vector<int> kept;
  for (int j : order) {
    Eigen::VectorXd w;
    if (OutsideSpan(X, kept, j, &w) <= kCollinearTolerance) return CollinearDesign(X, terms, kept, j, w, what);
    kept.push_back(j);
  }
  return Status::Ok();
}

double SquaredResidual(const std::vector<double>& x, const std::vector<double>& y, int cols,
                       const std::vector<double>& beta) {
  double ss = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    double p = 0;
    for (int j = 0; j < cols; ++j) p += x[i * cols + j] * beta[j];
    ss += (p - y[i]) * (p - y[i]);
  }
  return ss;
}

double RSquared(const std::vector<double>& x, const std::vector<double>& y, int cols, const std::vector<double>& beta) {
  double mean = 0;
  for (double v : y) mean += v;
  mean /= std::max<size_t>(1, y.size());
  double tot = 0;
  for (double v : y) tot += (v - mean) * (v - mean);
  return tot > 0 ? 1.0 - SquaredResidual(x, y, cols, beta) / tot : 1.0;
}

// Samples for the fit.
struct Samples {
  std::vector<double> decode_x, decode_y;    // [n, 4] (1, distinct, batch, context), seconds
  std::vector<int64_t> decode_source;        // [n] (step log index) · 2^32 + worker: FitWithinBatch's sources
  std::vector<double> prefill_x, prefill_y;  // [n, 2] (1, tokens)
  // From moe_layer_bench: per-layer (1, distinct, batch) → seconds, and the read bandwidth.
  std::vector<double> layer_x, layer_y;
  double read_bandwidth = 0;
};

// The work of each step on one dedicated core, from the [start, end] intervals of one log under processor
// sharing of `cores` cores: while n steps run, each progresses at min(1, cores / n), so a step's work is
// ∫ min(1, cores / n(t)) dt over its interval. n(t) is piecewise constant between interval edges; the
// integral is tabulated at the edges.
std::vector<double> DedicatedWork(const std::vector<std::pair<double, double>>& spans, double cores) {
  std::vector<std::pair<double, int>> edges;
  for (const auto& [a, b] : spans) {
    edges.emplace_back(a, +1);
    edges.emplace_back(b, -1);
  }
  std::sort(edges.begin(), edges.end());
  std::vector<double> at(edges.size()), integral(edges.size()), rate(edges.size());
  int n = 0;
  auto rate_of = [&](int k) { return k <= 0 ? 0.0 : std::min(1.0, cores / k); };
  for (size_t i = 0; i < edges.size(); ++i) {
    at[i] = edges[i].first;
    integral[i] = i == 0 ? 0.0 : integral[i - 1] + rate_of(n) * (at[i] - at[i - 1]);
    n += edges[i].second;
    rate[i] = rate_of(n);  // just after edge i
  }
  auto J = [&](double t) {
    const size_t k = static_cast<size_t>(std::upper_bound(at.begin(), at.end(), t) - at.begin());
    if (k == 0) return 0.0;
    return integral[k - 1] + rate[k - 1] * (t - at[k - 1]);
  };
  std::vector<double> out;
  out.reserve(spans.size());
  for (const auto& [a, b] : spans) out.push_back(b > a ? std::min(b - a, J(b) - J(a)) : 0.0);
  return out;
}

// A count field of a step record: an integer in `range`.
double CountField(const nlohmann::json& j, const char* key, const IntRange& range) {
  const double v = j.at(key).get<double>();
  if (!(v >= static_cast<double>(range.lo) && v <= static_cast<double>(range.hi)) || v != std::floor(v)) {
    throw std::runtime_error(std::string(key) + " must be " + range.Describe() + ", got " + j.at(key).dump());
  }
  return v;
}

// Far beyond any batch, context or prompt, below where doubles skip integers.
constexpr int64_t kMaxStepCount = 1'000'000'000'000'000;

// max_distinct: the distinct experts a decode step can touch, the model's MoE layers x routed experts.
// `log_index`: this log's place among the fit's files (its decode steps' sources are log_index · 2^32 + worker).
Status ReadStepLog(const std::string& path, int64_t log_index, Samples* s, double cores, int64_t max_distinct) {
  ELDR_RETURN_IF_ERROR(CheckInputFile(path, "a steps.jsonl file"));
  std::ifstream in(path);
  if (!in) return Status::IoError(path + ": cannot open");
  std::string line;
  int64_t n = 0;
  std::vector<std::pair<double, double>> decode_spans, prefill_spans;
  std::vector<std::pair<bool, double>> cpu_work;  // (decode?, cpu_seconds) per record, when the log has them
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      auto parsed = ParseJson(line);
      if (!parsed.ok()) throw std::runtime_error(parsed.status().message());
      j = std::move(parsed).value();
      if (!j.is_object()) throw std::runtime_error("a step record is a JSON object");
      const std::string kind = j.at("kind").get<std::string>();
      if (kind != "decode" && kind != "prefill")
        throw std::runtime_error("kind must be prefill or decode, got '" + kind + "'");
      // The fields of kStepFields (cost_model.h); another is a typo or another file, never ignored.
      const bool decode = kind == "decode";
      for (const auto& [key, value] : j.items()) {
        const auto in = [&key](const auto& keys) {
          return std::find(std::begin(keys), std::end(keys), key) != std::end(keys);
        };
        if (!in(kStepFields) && !(decode ? in(kDecodeStepFields) : in(kPrefillStepFields))) {
          throw std::runtime_error(
              "unknown field '" + key + "' in a " + kind +
              " step (the fields of serve's steps.jsonl: kind, seconds, time, worker, cpu_seconds, and " +
              (decode ? "batch, context_tokens, distinct_experts" : "prompt_tokens") + ")");
        }
      }
      // A step's time is a cost model time (kCostSeconds): 1e300 s overflowed the fit's residuals to inf, which
      // fitted a model that costs nothing.
      const double seconds = j.at("seconds").get<double>();
      if (!kCostSeconds.Contains(seconds)) throw std::runtime_error("seconds must be " + kCostSeconds.Describe());
      const double end = j.value("time", 0.0);
      if (j.contains("cpu_seconds") && !kCostSeconds.Contains(j.at("cpu_seconds").get<double>())) {
        throw std::runtime_error("cpu_seconds must be " + kCostSeconds.Describe());
      }
      const double cpu = j.value("cpu_seconds", -1.0);
      if (cpu >= 0) cpu_work.emplace_back(kind == "decode", cpu);
      if (kind == "decode") {
        const double distinct = CountField(j, "distinct_experts", IntRange::Between(0, max_distinct));
        const double batch = CountField(j, "batch", IntRange::Between(1, kMaxStepCount));
        const double context = CountField(j, "context_tokens", IntRange::Between(0, kMaxStepCount));
        const double worker = CountField(j, "worker", IntRange::Between(0, (int64_t{1} << 32) - 1));
        s->decode_x.insert(s->decode_x.end(), {1.0, distinct, batch, context});
        s->decode_source.push_back((log_index << 32) + static_cast<int64_t>(worker));
        s->decode_y.push_back(seconds);
        decode_spans.emplace_back(end - seconds, end);
      } else {  // prefill
        s->prefill_x.insert(s->prefill_x.end(),
                            {1.0, CountField(j, "prompt_tokens", IntRange::Between(1, kMaxStepCount))});
        s->prefill_y.push_back(seconds);
        prefill_spans.emplace_back(end - seconds, end);
      }
    } catch (const std::exception& e) {
      return Status::InvalidArgument(path + ":" + std::to_string(n) + ": not a step record: " + JsonErrorText(e));
    }
  }
  if (cores > 0 && cpu_work.size() == decode_spans.size() + prefill_spans.size()) {
    // The log has each step's CPU time: that is its dedicated-core work.
    size_t d = s->decode_y.size() - decode_spans.size(), p = s->prefill_y.size() - prefill_spans.size();
    for (const auto& [decode, cpu] : cpu_work) (decode ? s->decode_y[d++] : s->prefill_y[p++]) = cpu;
  } else if (cores > 0) {  // undo the sharing of `cores` cores among the steps in progress
    std::vector<std::pair<double, double>> spans = decode_spans;
    spans.insert(spans.end(), prefill_spans.begin(), prefill_spans.end());
    const std::vector<double> work = DedicatedWork(spans, cores);
    const size_t d0 = s->decode_y.size() - decode_spans.size(), p0 = s->prefill_y.size() - prefill_spans.size();
    for (size_t i = 0; i < decode_spans.size(); ++i) s->decode_y[d0 + i] = work[i];
    for (size_t i = 0; i < prefill_spans.size(); ++i) s->prefill_y[p0 + i] = work[decode_spans.size() + i];
  }
  return Status::Ok();
}

// Google Benchmark's time units in seconds; 0 for an unknown unit.
double SecondsPer(const std::string& unit) {
  if (unit == "ns") return 1e-9;
  if (unit == "us") return 1e-6;
  if (unit == "ms") return 1e-3;
  if (unit == "s") return 1;
  return 0;
}

// The two arguments of a BM_MoeLayer run's name, as Google Benchmark writes them: "BM_MoeLayer/16/64/real_time", or
// with moe_layer_bench's ArgNames "BM_MoeLayer/experts:16/batch:64/min_time:1.000/real_time". Empty strings when
// the name has fewer than two further components.
std::pair<std::string, std::string> MoeLayerArgs(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = name.find('/');
  while (start != std::string::npos && parts.size() < 2) {
    const size_t end = name.find('/', start + 1);
    std::string part = name.substr(start + 1, end == std::string::npos ? std::string::npos : end - start - 1);
    const size_t colon = part.find(':');
    parts.push_back(colon == std::string::npos ? part : part.substr(colon + 1));
    start = end;
  }
  parts.resize(2);
  return {parts[0], parts[1]};
}

// One BM_MoeLayer/<distinct>/<batch> run: its layer time in seconds, and the two numbers of its name within
// [0, 65535] distinct experts (of the benchmark's own layer, scaled to the model later: any expert count eldr
// reads) and [1, 2^20] sequences. Errors name the file and the run.
Status ReadMoeLayerRun(const std::string& where, const nlohmann::json& b, const std::pair<std::string, std::string>& m,
                       Samples* s) {
  const auto whole = [&](const std::string& text, int64_t lo, int64_t hi, const char* what) -> Result<double> {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
      return Status::InvalidArgument(where + ": " + what + " must be in [" + std::to_string(lo) + ", " +
                                     std::to_string(hi) + "], got " + (text.empty() ? "none" : text.substr(0, 40)));
    }
    return static_cast<double>(v);
  };
  ELDR_ASSIGN_OR_RETURN(const double distinct, whole(m.first, 0, 65535, "the distinct experts (of one layer)"));
  ELDR_ASSIGN_OR_RETURN(const double batch, whole(m.second, 1, int64_t{1} << 20, "the batch"));
  const std::string unit =
      b.contains("time_unit") && b["time_unit"].is_string() ? b["time_unit"].get<std::string>() : "";
  if (SecondsPer(unit) == 0) {
    return Status::InvalidArgument(where + ": time_unit must be ns, us, ms or s, got " +
                                   (b.contains("time_unit") ? b["time_unit"].dump() : std::string("none")));
  }
  const double value = b.contains("real_time") && b["real_time"].is_number() ? b["real_time"].get<double>() : -1;
  const double seconds = value * SecondsPer(unit);
  if (!(seconds > 0) || seconds > 3600) {
    return Status::InvalidArgument(where + ": real_time must be a time in (0, 3600] s, got " +
                                   (b.contains("real_time") ? b["real_time"].dump() : std::string("none")) + " " +
                                   unit);
  }
  s->layer_x.insert(s->layer_x.end(), {1.0, distinct, batch});
  s->layer_y.push_back(seconds);
  return Status::Ok();
}

Status ReadBenchJson(const std::string& path, const nlohmann::json& j, Samples* s) {
  if (!j.contains("benchmarks") || !j["benchmarks"].is_array()) {
    return Status::InvalidArgument(path + ": not Google Benchmark JSON (no 'benchmarks' array)");
  }
  for (size_t i = 0; i < j["benchmarks"].size(); ++i) {
    const auto& b = j["benchmarks"][i];
    const std::string where = path + ": benchmarks[" + std::to_string(i) + "]";
    if (!b.is_object() || !b.contains("name") || !b["name"].is_string()) {
      return Status::InvalidArgument(where + ": not a benchmark run (no string 'name')");
    }
    const std::string name = b["name"].get<std::string>();
    const bool iteration = !b.contains("run_type") || (b["run_type"].is_string() && b["run_type"] == "iteration");
    if (!iteration) continue;  // repetitions' aggregates: use the runs
    // Names are quoted in errors cut to 80 characters (a name is a file's content, of any length).
    const std::string run = where + " (" + name.substr(0, 80) + (name.size() > 80 ? "..." : "") + ")";
    if (name == "BM_MoeLayer" || name.rfind("BM_MoeLayer/", 0) == 0) {
      ELDR_RETURN_IF_ERROR(ReadMoeLayerRun(run, b, MoeLayerArgs(name), s));
    } else if (name.rfind("BM_Read", 0) == 0 && b.contains("GBps")) {
      // d is the KV of a token over this bandwidth: an implausible one (a unit slip) gives an implausible d.
      const double bps = b["GBps"].is_number() ? b["GBps"].get<double>() * 1e9 : std::nan("");
      if (!kMemoryBandwidth.Contains(bps)) {
        std::ostringstream text;
        text << run << ": a read bandwidth of " << b["GBps"].dump().substr(0, 40)
             << " GB/s; a memory bandwidth must be " << kMemoryBandwidth.Describe() << kMemoryBandwidth.Reason(bps);
        return Status::InvalidArgument(text.str());
      }
      s->read_bandwidth = std::max(s->read_bandwidth, bps);
    }
  }
  if (s->layer_y.empty()) return Status::InvalidArgument(path + ": no BM_MoeLayer/<distinct>/<batch> results in it");
  return Status::Ok();
}

}  // namespace

std::vector<double> NonNegativeLeastSquares(const std::vector<double>& x, const std::vector<double>& y, int cols) {
  // Exact for small problems: the NNLS optimum is the unconstrained optimum on its support, so try every
  // support and keep the best feasible one.
  std::vector<double> best(cols, 0.0);
  double best_ss = SquaredResidual(x, y, cols, best);
  for (unsigned mask = 1; mask < (1u << cols); ++mask) {
    std::vector<double> beta = SubsetLeastSquares(x, y, cols, mask);
    if (std::any_of(beta.begin(), beta.end(), [](double v) { return v < 0; })) continue;
    const double ss = SquaredResidual(x, y, cols, beta);
    if (ss < best_ss * (1 - 1e-12)) {
      best_ss = ss;
      best = beta;
    }
  }
  return best;
}

WithinBatchFit FitWithinBatch(const std::vector<double>& x, const std::vector<double>& y,
                              const std::vector<int64_t>& source) {
  WithinBatchFit w;
  const size_t n = y.size();
  if (n == 0) return w;
  ELDR_CHECK(source.empty() || source.size() == n,
             "FitWithinBatch: " << source.size() << " sources for " << n << " steps");
  std::map<std::pair<int64_t, double>, std::vector<size_t>> groups;  // (source, batch size) → rows
  double mean_distinct = 0;
  for (size_t i = 0; i < n; ++i) {
    groups[{source.empty() ? 0 : source[i], x[i * 4 + 2]}].push_back(i);
    mean_distinct += x[i * 4 + 1] / static_cast<double>(n);
  }
  double total_distinct = 0;
  for (size_t i = 0; i < n; ++i) total_distinct += (x[i * 4 + 1] - mean_distinct) * (x[i * 4 + 1] - mean_distinct);
  std::vector<double> t, e, c;  // time, distinct experts, context, each minus its group's mean
  for (const auto& [key, rows] : groups) {
    if (rows.size() < 2) continue;
    ++w.groups;
    double mt = 0, me = 0, mc = 0;
    for (size_t i : rows) {
      mt += y[i] / static_cast<double>(rows.size());
      me += x[i * 4 + 1] / static_cast<double>(rows.size());
      mc += x[i * 4 + 3] / static_cast<double>(rows.size());
    }
    for (size_t i : rows) {
      t.push_back(y[i] - mt);
      e.push_back(x[i * 4 + 1] - me);
      c.push_back(x[i * 4 + 3] - mc);
    }
  }
  w.steps = static_cast<int>(t.size());
  double see = 0, scc = 0, sec = 0, set = 0, sct = 0, stt = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    see += e[i] * e[i], scc += c[i] * c[i], sec += e[i] * c[i];
    set += e[i] * t[i], sct += c[i] * t[i], stt += t[i] * t[i];
  }
  w.within_share = total_distinct > 0 ? see / total_distinct : 0.0;
  if (!(see > 0)) return w;
  // Context constant within every batch size (or collinear with distinct): regress on distinct experts alone.
  const double det = see * scc - sec * sec;
  const bool with_context = scc > 0 && det > 1e-12 * see * scc;
  int params = 1;
  if (with_context) {
    w.b = (scc * set - sec * sct) / det;
    w.d = (see * sct - sec * set) / det;
    params = 2;
  } else {
    w.b = set / see;
  }
  double ssr = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const double r = t[i] - w.b * e[i] - w.d * c[i];
    ssr += r * r;
  }
  const int dof = w.steps - w.groups - params;
  if (dof > 0) w.b_se = std::sqrt(ssr / dof * (with_context ? scc / det : 1.0 / see));
  // Partial correlation: the residuals of time and of distinct experts after context, both within the groups.
  const double ee = with_context ? see - sec * sec / scc : see;
  const double tt = with_context ? stt - sct * sct / scc : stt;
  const double et = with_context ? set - sec * sct / scc : set;
  w.partial_r = ee > 0 && tt > 0 ? et / std::sqrt(ee * tt) : 0.0;
  return w;
}

namespace {
// A decode step that costs nothing simulates no TPOT at all and leaves eldr nothing to price: each term alone may be
// 0, but a step of one sequence over one expert (a + b + c) takes at least a nanosecond on any device (microseconds
// on a GPU, as the derived and fitted models say).
Status CheckDecodeCosts(const CostModel& m, const std::string& what) {
  constexpr double kMinStep = 1e-9;
  const double step = m.decode_a + m.decode_b + m.decode_c;
  if (!(step >= kMinStep)) {
    std::ostringstream text;
    text << what << ": decode.a + b + c = " << step
         << " s, so a decode step of one sequence over one expert would take under a nanosecond (no TPOT to "
            "simulate, nothing for eldr to price); give the step's real cost (at least 1e-9 s)";
    return Status::InvalidArgument(text.str());
  }
  return Status::Ok();
}

// LoadCostModel without the decode-step check, which a job's inline keys may still complete.
Result<CostModel> ReadCostModelFile(const std::string& path) {
  ELDR_ASSIGN_OR_RETURN(YAML::Node y, LoadYamlFile(path, "a cost model"));
  CostModel m;
  m.name = fs::path(path).stem().string();
  m.source = "given (" + path + ")";
  ELDR_RETURN_IF_ERROR(ApplyYaml(y, path, /*required=*/true, /*job_keys=*/false, &m));
  return m;
}
}  // namespace

Result<CostModel> LoadCostModel(const std::string& path) {
  ELDR_ASSIGN_OR_RETURN(CostModel m, ReadCostModelFile(path));
  ELDR_RETURN_IF_ERROR(CheckDecodeCosts(m, path));
  return m;
}

Result<CostModel> LoadJobCostModel(const std::string& job_path) {
  ELDR_ASSIGN_OR_RETURN(YAML::Node y, LoadYamlFile(job_path, "a job config"));
  YAML::Node sim = y["simulate"];
  if (!sim || !sim.IsMap()) {
    return Status::NotFound(job_path + ": no 'simulate:' section (give one with a cost_model, or pass --cost-model)");
  }
  CostModel m;
  const bool has_file = sim["cost_model"] && !sim["cost_model"].IsNull();
  if (has_file) {
    std::string file = sim["cost_model"].as<std::string>("");
    if (!fs::path(file).is_absolute()) {
      const fs::path near = fs::path(job_path).parent_path() / file;
      if (fs::exists(near)) file = near.lexically_normal().string();
    }
    auto read = ReadCostModelFile(file);
    if (!read.ok()) {  // named by its key: "job.yaml: simulate.cost_model: c.yaml: no such file"
      return read.status().WithPrefixIfAbout(file, job_path + ": simulate.cost_model");
    }
    m = std::move(read).value();
  } else {
    m.name = "inline";
    m.source = "given (" + job_path + " simulate:)";
  }
  ELDR_RETURN_IF_ERROR(ApplyYaml(sim, job_path, /*required=*/!has_file, /*job_keys=*/true, &m));
  if (has_file && sim.size() > 1) m.source += ", with the keys of " + job_path + " simulate: on top";
  ELDR_RETURN_IF_ERROR(CheckDecodeCosts(m, job_path + " (simulate:)"));
  return m;
}

Status CheckJobCostKeys(const std::string& job_path) {
  ELDR_ASSIGN_OR_RETURN(YAML::Node y, LoadYamlFile(job_path, "a job config"));
  const YAML::Node sim = y["simulate"];
  if (!sim) return Status::Ok();
  CostModel unused;
  return ApplyYaml(sim, job_path, /*required=*/false, /*job_keys=*/true, &unused);
}

Status CheckCostModel(const CostModel& m, const std::string& what) {
  for (const Key& k : kKeys) {
    const double v = m.*k.field;
    if (!k.range.Contains(v)) {
      std::ostringstream text;
      text << what << ": " << k.section << (*k.section ? "." : "") << k.name << " = " << v << ", must be "
           << k.range.Describe() << k.range.Reason(v);
      return Status::InvalidArgument(text.str());
    }
  }
  return CheckDecodeCosts(m, what);
}

std::string CostModelYaml(const CostModel& m) {
  std::ostringstream o;
  o.precision(6);
  o << "# eldr simulate cost model. decode step t = a + b*distinct_experts + c*batch + d*context_tokens;\n"
    << "# prefill t = a + b*computed_prompt_tokens; KV transfer t = latency_s + bytes/bandwidth_Bps. Seconds.\n"
    << "name: " << m.name << "\n"
    << "source: \"" << m.source << "\"\n"
    << "decode: {a: " << m.decode_a << ", b: " << m.decode_b << ", c: " << m.decode_c << ", d: " << m.decode_d << "}\n"
    << "prefill: {a: " << m.prefill_a << ", b: " << m.prefill_b << "}\n"
    << "kv_transfer: {latency_s: " << m.kv_latency << ", bandwidth_Bps: " << m.kv_bandwidth << "}\n"
    << "control_latency_s: " << m.control_latency << "\n";
  if (m.cores > 0) o << "cores: " << m.cores << "   # workers share this many CPU cores\n";
  return o.str();
}

CostModel DeriveCostModel(const ModelConfig& mc, const DeviceSpec& dev) {
  const double bytes = static_cast<double>(DtypeBytes(mc));
  const double H = mc.hidden_size, D = mc.head_dim;
  const double attn = H * (mc.num_attention_heads * D) * 2 + H * (mc.num_key_value_heads * D) * 2;
  const double shared = static_cast<double>(mc.n_shared_experts) * 3 * H * mc.moe_intermediate_size;
  const double gate = static_cast<double>(mc.num_experts) * H;
  const double dense_mlp = 3 * H * mc.intermediate_size;
  // Weights every decode step reads whatever the batch: attention, shared experts, gates, dense layers, the
  // LM head (the embedding is a gather, not a read of the table).
  const double fixed_params = mc.num_hidden_layers * attn + mc.num_moe_layers() * (shared + gate) +
                              mc.first_k_dense_replace * dense_mlp + static_cast<double>(mc.vocab_size) * H;
  const double active_params = fixed_params + static_cast<double>(mc.num_moe_layers()) * mc.num_experts_per_tok * 3 *
                                                  H * mc.moe_intermediate_size;
  CostModel m;
  m.name = dev.name + "-" + mc.name;
  m.decode_a = fixed_params * bytes / dev.memory_bandwidth + dev.step_overhead;
  m.decode_b = static_cast<double>(mc.expert_bytes()) / dev.memory_bandwidth;
  m.decode_c = 2.0 * active_params / (dev.peak_flops * dev.mfu);
  m.decode_d = KvBytesPerToken(mc) / dev.memory_bandwidth;
  m.prefill_a = m.decode_a;
  m.prefill_b = 2.0 * active_params / (dev.peak_flops * dev.mfu);
  m.kv_latency = dev.link_latency;
  m.kv_bandwidth = dev.link_bandwidth;
  m.control_latency = dev.control_latency;
  std::ostringstream s;
  s << "derived: " << mc.name << " " << mc.torch_dtype << " on " << dev.name << " ("
    << Fmt(dev.memory_bandwidth / 1e12, 2) << " TB/s, " << Fmt(dev.peak_flops / 1e12, 0) << " TFLOP/s x mfu "
    << Fmt(dev.mfu, 2) << "); expert " << Fmt(static_cast<double>(mc.expert_bytes()) / 1e6, 2) << " MB, fixed weights "
    << Fmt(fixed_params * bytes / 1e9, 2) << " GB, KV " << Fmt(KvBytesPerToken(mc) / 1e3, 1)
    << " KB/token; not measured";
  m.source = s.str();
  return m;
}

std::string FitReport::Summary() const {
  std::ostringstream o;
  o << "fit: " << decode_samples << " decode steps (R^2 " << Fmt(decode_r2, 3) << ", median relative error "
    << Fmt(100 * decode_median_rel_error, 1) << "%), "
    << (prefill_given_by.empty() ? std::to_string(prefill_samples) + " prefills (R^2 " + Fmt(prefill_r2, 3) + ")"
                                 : std::string("prefill terms given, not fitted"))
    << "\n"
    << "decode step = " << Fmt(model.decode_a * 1e3, 4) << " ms + " << Fmt(model.decode_b * 1e6, 3)
    << " us/distinct expert + " << Fmt(model.decode_c * 1e6, 3) << " us/sequence + " << Fmt(model.decode_d * 1e9, 3)
    << " ns/context token\n"
    << "prefill = " << Fmt(model.prefill_a * 1e3, 4) << " ms + " << Fmt(model.prefill_b * 1e6, 3) << " us/token"
    << (prefill_given_by.empty() ? "" : " (given, not fitted: " + prefill_given_by + ")") << "\n";
  const WithinBatchFit& w = within_batch;
  if (w.steps > 0) {
    o << "within batch sizes (" << w.steps << " steps in " << w.groups << " groups of one worker's batch size; "
      << Fmt(100 * w.within_share, 1)
      << "% of the distinct experts' variance is at a fixed batch): " << Fmt(w.b * 1e6, 3) << " +- "
      << Fmt(w.b_se * 1e6, 3) << " us/distinct expert (t = " << Fmt(w.t(), 1) << "), " << Fmt(w.d * 1e9, 3)
      << " ns/context token, partial r = " << Fmt(w.partial_r, 3) << "\n";
  }
  return o.str();
}

Result<FitReport> FitCostModel(const std::vector<std::string>& files, const ModelConfig& mc, double cores,
                               const CostModel* prefill) {
  if (!kCores.Contains(cores)) {
    return Status::InvalidArgument("--cores must be " + kCores.Describe() + kCores.Reason(cores));
  }
  if (files.empty()) return Status::InvalidArgument("--fit needs at least one steps.jsonl or moe_layer_bench JSON");
  for (size_t i = 0; i < files.size(); ++i) {  // a file given twice would count its steps twice
    for (size_t k = 0; k < i; ++k) {
      std::error_code ec;
      if (files[k] == files[i] || std::filesystem::equivalent(files[k], files[i], ec)) {
        return Status::InvalidArgument(files[i] + ": given to --fit twice (its steps would count twice)");
      }
    }
  }
  Samples s;
  std::string bench_file, steps_file;  // one of each kind, for the errors below
  for (const std::string& f : files) {
    ELDR_RETURN_IF_ERROR(CheckInputFile(f, "a steps.jsonl or moe_layer_bench JSON file"));
    std::ifstream in(f);
    if (!in) return Status::NotFound(f + ": no such file");
    ELDR_RETURN_IF_ERROR(CheckTextFile(f, "--fit reads eldr serve steps.jsonl and moe_layer_bench JSON files"));
    std::string first;
    in >> std::ws;
    std::getline(in, first);
    in.close();
    nlohmann::json j;
    bool whole = false;
    if (first.rfind("\xEF\xBB\xBF", 0) == 0) first.erase(0, 3);  // a UTF-8 byte order mark (the parser skips it too)
    if (!first.empty() && first[0] == '{' && first.find("\"kind\"") == std::string::npos) {
      std::ifstream all(f);
      try {
        j = nlohmann::json::parse(all);
        whole = true;
      } catch (const std::exception&) {
        whole = false;
      }
    }
    if (whole) {
      ELDR_RETURN_IF_ERROR(ReadBenchJson(f, j, &s));
      bench_file = f;
    } else {
      ELDR_RETURN_IF_ERROR(ReadStepLog(f, static_cast<int64_t>(&f - files.data()), &s, cores,
                                       static_cast<int64_t>(mc.num_moe_layers()) * mc.num_experts));
      steps_file = f;
    }
  }
  // The two kinds fit the decode terms each on their own: given together, one would be dropped.
  if (!bench_file.empty() && !steps_file.empty()) {
    return Status::InvalidArgument(bench_file + " (moe_layer_bench results) and " + steps_file +
                                   " (a step log) fit the same decode terms: give --fit one kind of file");
  }
  if (!bench_file.empty() && cores > 0) {
    return Status::InvalidArgument("--cores undoes the sharing of cores among logged steps; " + bench_file +
                                   " holds moe_layer_bench results (timed on their own): drop --cores");
  }
  FitReport r;
  CostModel& m = r.model;
  m.cores = cores;
  m.name = "fit";
  m.source = "fit to";
  for (const auto& f : files) m.source += " " + f;
  if (!s.decode_y.empty()) {
    if (s.decode_y.size() < 8)
      return Status::InvalidArgument("too few decode steps to fit (" + std::to_string(s.decode_y.size()) + ", need 8)");
    // Distinct experts last: the relation then reads "distinct experts = 50·batch".
    ELDR_RETURN_IF_ERROR(CheckIdentifiable(s.decode_x, 4, kDecodeTerms, {0, 2, 3, 1}, "decode steps"));
    const std::vector<double> beta = NonNegativeLeastSquares(s.decode_x, s.decode_y, 4);
    m.decode_a = beta[0];
    m.decode_b = beta[1];
    m.decode_c = beta[2];
    m.decode_d = beta[3];
    r.decode_samples = static_cast<int>(s.decode_y.size());
    r.from_step_logs = true;
    r.decode_r2 = RSquared(s.decode_x, s.decode_y, 4, beta);
    r.within_batch = FitWithinBatch(s.decode_x, s.decode_y, s.decode_source);
    std::vector<double> rel;
    for (size_t i = 0; i < s.decode_y.size(); ++i) {
      if (s.decode_y[i] <= 0) continue;
      const double p = m.DecodeStep(s.decode_x[i * 4 + 1], s.decode_x[i * 4 + 2], s.decode_x[i * 4 + 3]);
      rel.push_back(std::abs(p - s.decode_y[i]) / s.decode_y[i]);
    }
    if (!rel.empty()) {
      std::nth_element(rel.begin(), rel.begin() + rel.size() / 2, rel.end());
      r.decode_median_rel_error = rel[rel.size() / 2];
    }
  } else if (!s.layer_y.empty()) {
    if (s.layer_y.size() < 3) return Status::InvalidArgument("too few BM_MoeLayer results to fit (need 3)");
    ELDR_RETURN_IF_ERROR(CheckIdentifiable(s.layer_x, 3, kLayerTerms, {0, 2, 1}, "BM_MoeLayer results"));
    // Per-layer t = a' + b'·distinct + c'·batch; a step runs every MoE layer: a = L·a', b = b' (distinct is
    // already summed over layers), c = L·c'; d: the KV of a context token read at the measured bandwidth.
    const std::vector<double> beta = NonNegativeLeastSquares(s.layer_x, s.layer_y, 3);
    const double L = mc.num_moe_layers();
    m.decode_a = L * beta[0];
    m.decode_b = beta[1];
    m.decode_c = L * beta[2];
    if (!(s.read_bandwidth > 0)) {
      return Status::InvalidArgument(
          "the moe_layer_bench results hold no BM_Read run with GBps: decode.d (s per context token) is a token's KV "
          "bytes over that read bandwidth, and would be fitted as 0; run moe_layer_bench with BM_Read (its "
          "--benchmark_filter must match it) and give its JSON to --fit");
    }
    m.decode_d = KvBytesPerToken(mc) / s.read_bandwidth;
    r.decode_samples = static_cast<int>(s.layer_y.size());
    r.decode_r2 = RSquared(s.layer_x, s.layer_y, 3, beta);
    // No prefill measurements in the bench: a prompt token costs what a batch token costs.
    m.prefill_a = m.decode_a;
    m.prefill_b = m.decode_c;
    m.source += " (BM_MoeLayer per layer x " + std::to_string(mc.num_moe_layers()) + " MoE layers of " + mc.name +
                "; prefill assumed = per-token decode compute)";
  } else {
    return Status::InvalidArgument("no decode steps or BM_MoeLayer results in the input");
  }
  if (prefill) {
    m.prefill_a = prefill->prefill_a;
    m.prefill_b = prefill->prefill_b;
    r.prefill_given_by = prefill->source.empty() ? prefill->name : prefill->source;
    m.source += "; prefill given by " + r.prefill_given_by;
  } else if (!s.prefill_y.empty()) {
    ELDR_RETURN_IF_ERROR(CheckIdentifiable(s.prefill_x, 2, kPrefillTerms, {0, 1}, "prefills"));
    const std::vector<double> beta = NonNegativeLeastSquares(s.prefill_x, s.prefill_y, 2);
    m.prefill_a = beta[0];
    m.prefill_b = beta[1];
    r.prefill_samples = static_cast<int>(s.prefill_y.size());
    r.prefill_r2 = RSquared(s.prefill_x, s.prefill_y, 2, beta);
  }
  return r;
}

}  // namespace eldr
