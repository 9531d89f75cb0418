// eldr trace import | synth | stats
#include <cstdio>
#include <sstream>

#include "runtime/cli/commands.h"
#include "runtime/common/atomic_file.h"
#include "runtime/common/json_util.h"
#include "runtime/common/progress.h"
#include "runtime/common/signals.h"
#include "runtime/trace/stats.h"
#include "runtime/trace/synth.h"
#include "runtime/trace/synth_like.h"
#include "runtime/trace/trace.h"
#include "runtime/trace/trace_store.h"

namespace eldr::cli {

namespace {

// Parses "N" or "MIN:MAX" (also "MIN..MAX").
Status ParseRange(const std::string& text, const std::string& flag, int64_t* lo, int64_t* hi) {
  std::string s = text;
  size_t sep = s.find("..");
  size_t sep_len = 2;
  if (sep == std::string::npos) {
    sep = s.find(':');
    sep_len = 1;
  }
  try {
    size_t used = 0;
    if (sep == std::string::npos) {
      *lo = *hi = std::stoll(s, &used);
      if (used != s.size()) throw std::invalid_argument(s);
    } else {
      *lo = std::stoll(s.substr(0, sep), &used);
      if (used != sep) throw std::invalid_argument(s);
      const std::string rest = s.substr(sep + sep_len);
      *hi = std::stoll(rest, &used);
      if (used != rest.size()) throw std::invalid_argument(s);
    }
  } catch (const std::exception&) {
    return Status::InvalidArgument(flag + " '" + text + "' must be N or MIN:MAX");
  }
  if (*lo > *hi) return Status::InvalidArgument(flag + " '" + text + "': MIN exceeds MAX");
  return Status::Ok();
}

Status ParseMix(const std::string& text, int num_domains, std::vector<double>* mix) {
  mix->clear();
  if (text.empty() || text == "uniform") return Status::Ok();
  if (text == "wildchat") {
    if (num_domains < 2) return Status::InvalidArgument("--mix wildchat needs --domains >= 2");
    *mix = WildChatMix(num_domains);
    return Status::Ok();
  }
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      double v = std::stod(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      mix->push_back(v);
    } catch (const std::exception&) {
      return Status::InvalidArgument("--mix '" + text + "' must be uniform, wildchat or comma-separated weights");
    }
  }
  return Status::Ok();
}

// `trace synth --like`: fit, report the fit and novelty, stream the generated requests to `out`.
Status SynthesizeLike(const std::string& like, LikeSynthOptions lopts, bool no_weights, const std::string& out) {
  if (lopts.num_requests < 1) {
    return Status::InvalidArgument("--requests must be >= 1, got " + std::to_string(lopts.num_requests));
  }
  InstallInterruptHandlers();
  ELDR_RETURN_IF_ERROR(CheckOutputs({{out, "--out"}}, {{like, "--like"}}));
  ELDR_ASSIGN_OR_RETURN(Trace real, ReadTrace(like));
  auto fitted = FitLikeModel(real);
  if (!fitted.ok()) return fitted.status().WithPrefix(like);
  const LikeModel& model = fitted.value();
  lopts.with_weights = model.with_weights && !no_weights;
  ELDR_ASSIGN_OR_RETURN(NoveltyChecker novelty, NoveltyChecker::Create(real));
  // Options are checked before the output file is opened, so bad input leaves no file behind.
  ELDR_RETURN_IF_ERROR(GenerateLike(
      model,
      [&] {
        LikeSynthOptions probe = lopts;
        probe.num_requests = 1;
        return probe;
      }(),
      [](const TraceRequest&, const uint16_t*, const float*) { return Status::Ok(); }));
  ELDR_ASSIGN_OR_RETURN(auto writer, TraceWriter::Open(out, model.shape, lopts.with_weights));
  ProgressBar bar("synth", lopts.num_requests);  // drawn only on a terminal
  ELDR_RETURN_IF_ERROR(GenerateLike(model, lopts, [&](const TraceRequest& r, const uint16_t* ids, const float* w) {
    novelty.Add(r, ids);
    bar.Advance();
    return writer->Append(r, ids, w);
  }));
  bar.Finish();
  ELDR_RETURN_IF_ERROR(writer->Finish());
  std::vector<std::vector<std::string>> rows;
  for (const auto& d : model.domains) {
    rows.push_back({d.name.empty() ? "(none)" : d.name, std::to_string(d.lengths.size()), Fmt(d.mix),
                    Fmt(d.dispersion, 4), Fmt(d.concentration, 1)});
  }
  std::printf("fitted to %s (%s): separation %s\n%s", like.c_str(), model.shape.ToString().c_str(),
              Fmt(lopts.separation, 2).c_str(),
              FormatTable({"domain", "real_requests", "mix", "dispersion_D", "concentration_alpha"}, rows).c_str());
  std::printf("%s", novelty.Report().ToText().c_str());
  std::printf("wrote %lld requests, %lld tokens (%s, %zu domains) to %s\n",
              static_cast<long long>(writer->num_requests()), static_cast<long long>(writer->num_tokens()),
              model.shape.ToString().c_str(), model.domains.size(), out.c_str());
  return Status::Ok();
}

}  // namespace

void AddTraceCommand(CLI::App& app, Action* action) {
  CLI::App* trace = app.add_subcommand("trace", "Routing traces: import JSONL, synthesise, statistics");
  trace->require_subcommand(1);

  // import
  {
    auto* cmd =
        trace->add_subcommand("import", "Convert a JSONL routing trace (plain or .gz) into the HDF5 trace format");
    auto in = std::make_shared<std::string>(), out = std::make_shared<std::string>();
    cmd->add_option("--in", *in, "JSONL routing trace (DESIGN.md §5); gzip is read transparently")
        ->required()
        ->check(NonEmptyPath());
    cmd->add_option("--out", *out, "HDF5 trace to write")->required()->check(NonEmptyPath());
    cmd->callback([=] {
      *action = [=]() -> Status {
        InstallInterruptHandlers();
        ImportSummary s;
        ELDR_RETURN_IF_ERROR(ImportJsonlTrace(*in, *out, &s));
        std::printf("imported %lld requests, %lld tokens (%s%s) into %s\n", static_cast<long long>(s.num_requests),
                    static_cast<long long>(s.num_tokens), s.shape.ToString().c_str(),
                    s.has_weights ? ", with gate weights" : "", out->c_str());
        return Status::Ok();
      };
    });
  }

  // synth
  {
    auto* cmd = trace->add_subcommand("synth", "Generate a synthetic domain-structured routing trace");
    auto o = std::make_shared<SynthOptions>();
    auto out = std::make_shared<std::string>();
    auto prompt = std::make_shared<std::string>("128"), output = std::make_shared<std::string>("128");
    auto mix = std::make_shared<std::string>("uniform");
    auto no_weights = std::make_shared<bool>(false);
    // Ranges checked before CLI11 converts (its own message says only "could not be converted"): the trace
    // format's limits (runtime/trace/trace.h); --top-k <= --experts is checked with the shape.
    cmd->add_option("--domains", o->num_domains, "number of domains")
        ->capture_default_str()
        ->check(InRange(IntRange::Between(1, kMaxTraceExperts)));
    cmd->add_option("--requests", o->num_requests, "number of requests")
        ->capture_default_str()
        ->check(InRange(IntRange::AtLeast(1)));
    cmd->add_option("--layers", o->num_layers, "MoE layers (L)")
        ->capture_default_str()
        ->check(InRange(IntRange::Between(1, kMaxTraceLayers)));
    cmd->add_option("--experts", o->num_experts, "routed experts per layer (E)")
        ->capture_default_str()
        ->check(InRange(IntRange::Between(1, kMaxTraceExperts)));
    cmd->add_option("--top-k", o->top_k, "experts per token per layer (k)")
        ->capture_default_str()
        ->check(InRange(IntRange::Between(1, kMaxTraceExperts)));
    cmd->add_option("--prompt-len", *prompt, "prompt tokens: N or MIN:MAX")->capture_default_str();
    cmd->add_option("--output-len", *output, "decode tokens: N or MIN:MAX")->capture_default_str();
    cmd->add_option("--mix", *mix, "domain mix: uniform, wildchat (two domains ~75%) or weights w1,w2,...")
        ->capture_default_str();
    cmd->add_option("--domain-affinity", o->domain_affinity, "probability mass on the domain's experts")
        ->capture_default_str()
        ->check(InRange(NumberRange::Between(0, 1)));
    cmd->add_option("--shared-fraction", o->shared_fraction, "probability mass on the shared popular experts")
        ->capture_default_str()
        ->check(InRange(NumberRange::Between(0, 1)));
    cmd->add_option("--request-affinity", o->request_affinity, "per-request preference strength")
        ->capture_default_str()
        ->check(InRange(NumberRange::Between(0, 1)));
    cmd->add_option("--seed", o->seed, "random seed")->capture_default_str()->check(SeedValue());
    cmd->add_option("--model", o->model, "model name stored in the trace")->capture_default_str();
    cmd->add_flag("--no-weights", *no_weights, "do not emit topk_weights");
    cmd->add_option("--out", *out, "HDF5 trace to write")->required()->check(NonEmptyPath());
    // --like: a generative model fitted to a real trace (runtime/trace/synth_like.h); shape, domains, mix and
    // lengths come from that trace, so the parametric options above (except --requests, --seed, --no-weights)
    // do not apply.
    auto like = std::make_shared<std::string>();
    auto lo = std::make_shared<LikeSynthOptions>();
    auto* like_opt = cmd->add_option("--like", *like, "fit the generator to this real HDF5 trace (unique requests)");
    cmd->add_option("--separation", lo->separation, "with --like: domain separation, 1 = as fitted, >1 apart")
        ->capture_default_str()
        ->check(InRange(NumberRange::Between(0, 100)));
    cmd->add_option("--length-jitter", lo->length_jitter, "with --like: log-normal sigma on resampled lengths")
        ->capture_default_str()
        ->check(InRange(NumberRange::Between(0, 5)));
    auto* domains_opt = cmd->get_option("--domains");
    auto* requests_opt = cmd->get_option("--requests");
    cmd->callback([=] {
      *action = [=]() -> Status {
        // An option of the other mode would be ignored: refuse it instead.
        const bool with_like = like_opt->count() > 0;
        for (const char* name : {"--layers", "--experts", "--top-k", "--prompt-len", "--output-len", "--mix",
                                 "--domain-affinity", "--shared-fraction", "--request-affinity", "--model"}) {
          if (with_like && cmd->count(name) > 0) {
            return Status::InvalidArgument(std::string(name) +
                                           " does not apply with --like (the shape, domains and lengths come from "
                                           "the trace); omit it");
          }
        }
        for (const char* name : {"--separation", "--length-jitter"}) {
          if (!with_like && cmd->count(name) > 0) {
            return Status::InvalidArgument(std::string(name) + " applies only with --like TRACE");
          }
        }
        if (!like->empty()) {
          LikeSynthOptions lopts = *lo;
          lopts.num_requests = o->num_requests;
          if (requests_opt->count() == 0) lopts.num_requests = 1000;
          lopts.num_domains = domains_opt->count() > 0 ? o->num_domains : 0;
          lopts.seed = o->seed;
          return SynthesizeLike(*like, lopts, *no_weights, *out);
        }
        if (like_opt->count() > 0) return Status::InvalidArgument("--like needs a trace path");
        SynthOptions opts = *o;
        ELDR_RETURN_IF_ERROR(ParseRange(*prompt, "--prompt-len", &opts.prompt_len_min, &opts.prompt_len_max));
        ELDR_RETURN_IF_ERROR(ParseRange(*output, "--output-len", &opts.output_len_min, &opts.output_len_max));
        ELDR_RETURN_IF_ERROR(ParseMix(*mix, opts.num_domains, &opts.domain_mix));
        opts.with_weights = !*no_weights;
        InstallInterruptHandlers();
        ELDR_RETURN_IF_ERROR(CheckOutputPath(*out));  // before the synthesis, not after it
        ELDR_ASSIGN_OR_RETURN(Trace t, SynthesizeTrace(opts));
        ELDR_RETURN_IF_ERROR(WriteTrace(t, *out));
        std::printf("wrote %zu requests, %lld tokens (%s, %d domains) to %s\n", t.requests.size(),
                    static_cast<long long>(t.num_tokens_total()), t.shape.ToString().c_str(), opts.num_domains,
                    out->c_str());
        return Status::Ok();
      };
    });
  }

  // stats
  {
    auto* cmd = trace->add_subcommand(
        "stats", "Per-domain counts, prefill/decode correlation, same-domain vs mixed distinct experts");
    auto path = std::make_shared<std::string>();
    auto as_json = std::make_shared<bool>(false);
    auto o = std::make_shared<TraceStatsOptions>();
    cmd->add_option("trace", *path, "HDF5 trace")->required()->check(NonEmptyPath());
    cmd->add_flag("--json", *as_json, "print JSON instead of tables");
    cmd->add_option("--batch-sizes", o->batch_sizes, "decode batch sizes B")
        ->capture_default_str()
        ->check(InRange(IntRange::Between(1, TraceStatsOptions::kMaxBatchSize)));
    cmd->add_option("--batches", o->num_batches, "sampled batches per B and kind")
        ->capture_default_str()
        ->check(InRange(IntRange::Between(1, TraceStatsOptions::kMaxBatches)));
    cmd->add_option("--seed", o->seed, "sampling seed")->capture_default_str()->check(SeedValue());
    cmd->callback([=] {
      *action = [=]() -> Status {
        ELDR_ASSIGN_OR_RETURN(Trace t, ReadTrace(*path));
        auto stats = ComputeTraceStats(t, *o);
        if (!stats.ok()) return stats.status().WithPrefix(*path);
        PrintResult(*as_json, stats->ToText(), DumpJson(WithProvenance(stats->ToJson(), *cmd)));
        return Status::Ok();
      };
    });
  }
}

}  // namespace eldr::cli
