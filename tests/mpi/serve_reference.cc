// serve_reference: the single-process oracle for `eldr serve`'s decoded tokens (tests/mpi/serve_test.sh).
//
// Reads the same job config, requests and weights as the job and runs every request alone, in one process:
// a fresh Executor per request, a cold prefill of the whole prompt (gates replayed from the trace when
// model.gate is replay, as the job does), then greedy decode one token at a time with batch size 1. No prefix
// cache, no block manager, no KV shipping, no batching, no MPI: none of the job's machinery is on this path,
// so agreement checks it. Writes one line per request: {"id": ..., "tokens": [...]}, the prefill's token first.
//
// A test helper rather than an `eldr serve --reference` mode: the oracle stays out of the shipped binary and
// out of runtime/serve, so a later change to the job cannot quietly change the reference with it.
//
// Usage: serve_reference JOB.yaml OUT.jsonl
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/job/job_config.h"
#include "runtime/job/workload.h"
#include "runtime/model/executor.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"

namespace eldr {
namespace {

// The job's weights, as runtime/serve/serve.cc loads them (synthetic: seeded, one embedding band per domain).
Result<ModelWeights> JobWeights(const JobConfig& c, const ModelConfig& mc, int num_domains) {
  if (c.weights == "synthetic") {
    SyntheticWeightOptions o;
    o.seed = c.weight_seed;
    o.num_domains = std::max(1, num_domains);
    return MakeSyntheticWeights(mc, o);
  }
  return LoadSafetensors(mc, c.weights);
}

// Output tokens of workload request i ([output_len], prefill's first).
Result<std::vector<int32_t>> RunAlone(const JobConfig& c, const JobRequests& in, const ModelWeights& w, int64_t i) {
  const ModelConfig& mc = w.config;
  const TraceRequest& r = in.request(i);
  const std::vector<int32_t> prompt = PromptTokens(r, in.trace.Domains(), mc.vocab_size);
  const int64_t output_len = in.output_len[i];
  const int64_t context = static_cast<int64_t>(prompt.size()) + output_len;
  const int num_blocks = static_cast<int>((context + c.block_size - 1) / c.block_size);
  Executor ex(w, num_blocks, c.block_size);
  std::vector<BlockId> table(num_blocks);
  for (int b = 0; b < num_blocks; ++b) table[b] = b;

  std::vector<uint16_t> rows;
  GateReplay replay;
  if (c.replay_gates) {
    rows = RoutingRows(in.trace, r, 0, r.prompt_len);
    replay.ids = rows.data();
  }
  ELDR_ASSIGN_OR_RETURN(PrefillResult pre, ex.Prefill(prompt, table, 0, c.replay_gates ? &replay : nullptr, nullptr));
  std::vector<int32_t> out = {pre.next_token};
  for (int64_t step = 0; step + 1 < output_len; ++step) {
    const int64_t position = r.prompt_len + step;
    GateReplay one;
    if (c.replay_gates) {
      rows = RoutingRows(in.trace, r, position, 1);
      one.ids = rows.data();
    }
    DecodeSequence s{out.back(), static_cast<int32_t>(position), &table, c.replay_gates ? &one : nullptr};
    ELDR_ASSIGN_OR_RETURN(DecodeResult d, ex.Decode({s}));
    out.push_back(d.next_tokens[0]);
  }
  return out;
}

Status Run(const std::string& config_path, const std::string& out_path) {
  ELDR_ASSIGN_OR_RETURN(JobConfig c, LoadJobConfig(config_path));
  ELDR_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(c.model_config));
  ELDR_ASSIGN_OR_RETURN(JobRequests in, LoadJobRequests(c));
  if (c.replay_gates && !mc.trace_shape().SameAs(in.trace.shape)) {
    return Status::FailedPrecondition(c.trace + ": routing shape differs from the model; replay needs the same shape");
  }
  ELDR_ASSIGN_OR_RETURN(ModelWeights w, JobWeights(c, mc, static_cast<int>(in.trace.Domains().size())));
  std::ofstream out(out_path);
  if (!out) return Status::IoError(out_path + ": cannot write");
  for (int64_t i = 0; i < in.size(); ++i) {
    ELDR_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, RunAlone(c, in, w, i));
    out << nlohmann::json{{"id", in.ReportId(i)}, {"tokens", tokens}}.dump() << "\n";
  }
  out.close();
  if (!out) return Status::IoError(out_path + ": write failed");
  return Status::Ok();
}

}  // namespace
}  // namespace eldr

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s JOB.yaml OUT.jsonl\n", argv[0]);
    return 2;
  }
  const eldr::Status st = eldr::Run(argv[1], argv[2]);
  if (!st.ok()) {
    std::fprintf(stderr, "serve_reference: error: %s\n", st.message().c_str());
    return 1;
  }
  return 0;
}
