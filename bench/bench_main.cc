// The main() of eldr's Google Benchmark binaries: the provenance of the numbers (runtime/common/provenance.h:
// eldr version, git sha, build type, date) goes into the benchmark context, so the console header and
// --benchmark_format=json both carry it beside Google Benchmark's own (host, CPU, caches, load average).
#include <benchmark/benchmark.h>

#include "bench/bench_provenance.h"

int main(int argc, char** argv) {
  eldr::bench::AddProvenanceContext();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
