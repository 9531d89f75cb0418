// Provenance of benchmark figures (runtime/common/provenance.h) as Google Benchmark custom context: printed in
// the console header and written under "context" in --benchmark_format=json.
#pragma once

#include <benchmark/benchmark.h>

#include <string>

#include "runtime/common/provenance.h"

namespace eldr::bench {

inline void AddProvenanceContext() {
  const BuildInfo b = GetBuildInfo();
  benchmark::AddCustomContext("eldr_version", std::string(b.version));
  benchmark::AddCustomContext("git_sha", std::string(b.git_sha));
  benchmark::AddCustomContext("build_type", std::string(b.build_type));
  benchmark::AddCustomContext("date", UtcNow());
}

}  // namespace eldr::bench
