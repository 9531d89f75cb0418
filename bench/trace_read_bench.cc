// trace_read_bench: what `eldr calibrate` spends reading traces, file against file and reader against reader in
// one loop (bench/README.md "Offline calibration"). Usage:
//   trace_read_bench [--repeats N] [--threads T] FILE...
// For every repeat and every file, in turn: `counts` = ReadTraceCounts (ids streamed, validated and counted per
// request while the chunks inflate: calibrate's read), `whole` = ReadTrace without weights (ids inflated on the
// threads into memory, validated) + CountTrace (the read and count calibrate did before). Prints the median
// seconds of each, the file's size and whether the two agreed bit for bit; a `#` header with the provenance.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/common/parallel.h"
#include "runtime/signature/signature.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

bool SameCounts(const eldr::TraceCounts& a, const eldr::TraceCounts& b) {
  return a.prefill_counts == b.prefill_counts && a.decode_counts == b.decode_counts;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 3, threads = 0;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--repeats" || a == "--threads") && i + 1 < argc) {
      (a == "--repeats" ? repeats : threads) = std::atoi(argv[++i]);
    } else {
      files.push_back(a);
    }
  }
  if (files.empty() || repeats < 1) {
    std::fprintf(stderr, "usage: trace_read_bench [--repeats N] [--threads T] FILE...\n");
    return 2;
  }
  eldr::TraceReadOptions o;
  o.weights = false;
  o.num_threads = threads;
  std::printf("# trace_read_bench: repeats %d, threads %d\n", repeats, threads > 0 ? threads : eldr::DefaultThreads());
  std::vector<std::vector<double>> counts_s(files.size()), whole_s(files.size());
  std::vector<int> agree(files.size(), 1);
  for (int r = 0; r < repeats; ++r) {
    for (size_t f = 0; f < files.size(); ++f) {
      const auto t0 = Clock::now();
      auto c = eldr::ReadTraceCounts(files[f], o);
      const auto t1 = Clock::now();
      auto t = eldr::ReadTrace(files[f], o);
      if (!c.ok() || !t.ok()) {
        std::fprintf(stderr, "eldr: error: %s\n", (!c.ok() ? c.status() : t.status()).message().c_str());
        return 1;
      }
      const eldr::TraceCounts w = eldr::CountTrace(t.value());
      const auto t2 = Clock::now();
      counts_s[f].push_back(std::chrono::duration<double>(t1 - t0).count());
      whole_s[f].push_back(std::chrono::duration<double>(t2 - t1).count());
      agree[f] &= SameCounts(c.value(), w) ? 1 : 0;
    }
  }
  std::printf("%-40s %10s %10s %10s %7s %6s\n", "file", "MB", "counts_s", "whole_s", "ratio", "same");
  for (size_t f = 0; f < files.size(); ++f) {
    const double mb = static_cast<double>(std::filesystem::file_size(files[f])) / 1e6;
    const double c = Median(counts_s[f]), w = Median(whole_s[f]);
    std::printf("%-40s %10.1f %10.3f %10.3f %7.2f %6s\n", files[f].c_str(), mb, c, w, c / w, agree[f] ? "yes" : "NO");
  }
  return 0;
}
