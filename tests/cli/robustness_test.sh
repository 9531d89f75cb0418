#!/usr/bin/env bash
# The file policy of every command (issue 14, runtime/common/atomic_file.h): inputs that are FIFOs or devices are
# refused before they are opened (a FIFO without a writer would block forever); outputs that are device nodes,
# FIFOs, symbolic links, directories or one of the command's inputs are refused before any work and left as they
# were; a full disk is one line naming the file (never a crash) for import, synth and calibrate; SIGINT, SIGTERM
# and SIGHUP during a long import or synth end with 128 + signal, one line, and no temporary. Every case asserts
# the exit code, exactly one stderr line, the named file, and that nothing was left behind or changed.
# Usage: robustness_test.sh /path/to/eldr /path/to/source
set -u
ELDR="$1"
SRC="$2"
WORK="$(mktemp -d)"
MNT="$WORK/full"
cleanup() {
  mountpoint -q "$MNT" 2>/dev/null && umount "$MNT"
  rm -rf "$WORK"
}
trap cleanup EXIT
cd "$WORK"
source "$SRC/tests/lib.sh"

# Temporaries of OUTPUT (".NAME.tmp.*" beside it).
temps_of() { ls -a "$(dirname "$1")" 2>/dev/null | grep "^\.$(basename "$1")\.tmp"; }

# check_run NAME RC_WANT PATTERN : the last command (stderr in $WORK/err.txt, exit in $rc) exited RC_WANT (or any
# non-zero when RC_WANT is "fail") with exactly one stderr line matching PATTERN. Prints nothing; returns 1 and
# records the failure otherwise.
check_run() {
  local name="$1" want="$2" pattern="$3" lines
  lines=$(wc -l <"$WORK/err.txt")
  if [ "$want" = fail ] && { [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; }; then
    bad "$name" "exit code $rc (want 1..127; 139 is a segfault)"; return 1
  fi
  if [ "$want" != fail ] && [ "$rc" -ne "$want" ]; then bad "$name" "exit code $rc, want $want"; return 1; fi
  if [ "$lines" -ne 1 ]; then bad "$name" "stderr has $lines lines: $(head -3 "$WORK/err.txt")"; return 1; fi
  if ! grep -qE -- "$pattern" "$WORK/err.txt"; then bad "$name" "stderr '$(cat "$WORK/err.txt")' lacks /$pattern/"; return 1; fi
  return 0
}

# expect_untouched NAME PATTERN FILE CMD... : the command fails with one line matching PATTERN, FILE (an input or an
# existing output) keeps its content and type, and no temporary of FILE is left.
expect_untouched() {
  local name="$1" pattern="$2" file="$3"; shift 3
  local before; before=$(md5sum <"$file")
  "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"
  rc=$?
  check_run "$name" fail "$pattern" || return
  if [ "$(md5sum <"$file")" != "$before" ]; then bad "$name" "$file was changed"; return; fi
  if [ -n "$(temps_of "$file")" ]; then bad "$name" "temporary left: $(temps_of "$file")"; return; fi
  ok "$name"
}

# ---- inputs ----
"$ELDR" trace synth --domains 3 --requests 40 --layers 4 --experts 16 --top-k 2 --prompt-len 8:16 --output-len 8 \
  --seed 1 --out t.h5 >/dev/null || { bad "synth the input trace"; finish; exit 1; }
"$ELDR" calibrate --trace t.h5 -K 2 --out c.h5 --quiet || { bad "calibrate the input"; finish; exit 1; }
/usr/bin/python3 - <<'PYEOF' >g.jsonl
import json
for r in range(30):
    toks = [[[(t + l + j) % 16 for j in range(2)] for l in range(4)] for t in range(12)]
    print(json.dumps({"id": f"r{r}", "domain": "d", "num_layers": 4, "num_experts": 16, "top_k": 2,
                      "num_tokens": 12, "prompt_len": 6, "topk_ids": toks}))
PYEOF
# A JSONL of ~3 MB: zlib reads 1 MB at a time, so a FIFO fed with it has the import running (and its temporary
# created) while the rest of the input is still to come.
/usr/bin/python3 - <<'PYEOF' >long.jsonl
import json
for r in range(2000):
    toks = [[[(t + l + j + r) % 16 for j in range(2)] for l in range(4)] for t in range(40)]
    print(json.dumps({"id": f"r{r}", "num_layers": 4, "num_experts": 16, "top_k": 2, "num_tokens": 40,
                      "prompt_len": 20, "topk_ids": toks}))
PYEOF

# ---- outputs that are not regular files ----
if mknod ff c 1 7 2>/dev/null; then  # /dev/full
  for cmd in "calibrate --trace t.h5 -K 2 --out ff" "calibrate --trace t.h5 -K 2 --out c2.h5 --report ff" \
             "trace synth --requests 4 --out ff" "trace import --in g.jsonl --out ff"; do
    "$ELDR" $cmd >"$WORK/out.txt" 2>"$WORK/err.txt"
    rc=$?
    if check_run "device node: $cmd" fail "ff: cannot write: it is a character device"; then
      if [ -c ff ] && [ -z "$(temps_of ff)" ] && [ ! -e c2.h5 ]; then ok "device node: $cmd"; else
        bad "device node: $cmd" "ff is no longer a character device, or a temporary/partial output was left"; fi
    fi
  done
else
  echo "skip   device node cases (mknod needs root)"
fi
mkfifo pipe
for cmd in "calibrate --trace t.h5 -K 2 --out pipe" "trace synth --requests 4 --out pipe" \
           "trace import --in g.jsonl --out pipe" "calibrate --trace t.h5 -K 2 --out c2.h5 --report pipe"; do
  timeout 20 "$ELDR" $cmd >"$WORK/out.txt" 2>"$WORK/err.txt"
  rc=$?
  if check_run "FIFO: $cmd" fail "pipe: cannot write: it is a FIFO"; then
    if [ -p pipe ] && [ -z "$(temps_of pipe)" ] && [ ! -e c2.h5 ]; then ok "FIFO: $cmd"; else bad "FIFO: $cmd" "pipe replaced"; fi
  fi
done
# ---- inputs that are not regular files ----
# Opening a FIFO without a writer blocks in open(); the import used to wait there forever (and, its SIGTERM handler
# only setting a flag, could be ended by SIGKILL alone). Every reader of a whole file (HDF5, YAML, JSON) refuses a
# non-regular input before opening it. `timeout -s KILL` keeps a regression from hanging the suite: its 137 fails
# check_run.
mkfifo pipe.json
for cmd in "trace stats pipe" "inspect pipe" "calibrate --trace pipe -K 2 --out c2.h5" \
           "route --calib pipe --trace t.h5" "route --calib c.h5 --trace pipe" "place profile --load pipe -P 16 -R 2" \
           "place profile --load pipe.json -P 16 -R 2" "simulate -c pipe --no-output" "trace synth --like pipe --out imp.h5" \
           "simulate --fit pipe --model $SRC/configs/models/tiny.yaml -o imp.yaml"; do
  timeout -s KILL 20 "$ELDR" $cmd >"$WORK/out.txt" 2>"$WORK/err.txt"
  rc=$?
  if check_run "FIFO input: $cmd" fail "pipe(\.json)?: is a FIFO, not a regular file"; then
    if [ -p pipe ] && [ -p pipe.json ] && [ ! -e imp.h5 ] && [ ! -e imp.yaml ] && [ ! -e c2.h5 ]; then ok "FIFO input: $cmd"; else
      bad "FIFO input: $cmd" "the FIFO was replaced or an output was left"; fi
  fi
done
for cmd in "calibrate --trace /dev/zero -K 2 --out c2.h5" "place profile --load /dev/zero -P 16 -R 2"; do
  timeout -s KILL 20 "$ELDR" $cmd >"$WORK/out.txt" 2>"$WORK/err.txt"
  rc=$?
  check_run "device input: $cmd" fail "/dev/zero: is a character device, not a regular file" && ok "device input: $cmd"
done
# The JSONL import streams: a pipe is an input (a writer that never comes is waited for until a signal), a device
# is not.
cat g.jsonl | timeout -s KILL 20 "$ELDR" trace import --in /dev/stdin --out imp.h5 >"$WORK/out.txt" 2>"$WORK/err.txt"
rc=$?
if [ "$rc" -eq 0 ] && [ -f imp.h5 ] && "$ELDR" trace stats imp.h5 >/dev/null 2>&1; then ok "import from a pipe (/dev/stdin)"; else
  bad "import from a pipe (/dev/stdin)" "exit $rc: $(head -2 "$WORK/err.txt")"; fi
rm -f imp.h5
timeout -s KILL 20 "$ELDR" trace import --in pipe --out imp.h5 >"$WORK/out.txt" 2>"$WORK/err.txt" &
pid=$!
sleep 0.5
kill -s TERM $pid
wait $pid
rc=$?
if check_run "FIFO input without a writer, then SIGTERM" 143 "interrupted by SIGTERM"; then
  if [ -p pipe ] && [ ! -e imp.h5 ] && [ -z "$(temps_of imp.h5)" ]; then ok "FIFO input without a writer, then SIGTERM"; else
    bad "FIFO input without a writer, then SIGTERM" "the FIFO was replaced or an output was left"; fi
fi
timeout -s KILL 20 "$ELDR" trace import --in /dev/zero --out imp.h5 >"$WORK/out.txt" 2>"$WORK/err.txt"
rc=$?
check_run "device input: trace import" fail "/dev/zero: is a character device, not a regular file" && [ ! -e imp.h5 ] &&
  ok "device input: trace import"
# A load whose declared shape is [1, 2^31] in a file of a few KB (chunked, never written): refused from its shape,
# before 16 GiB are allocated for it.
/usr/bin/python3 -c "
import h5py
with h5py.File('huge.h5', 'w') as f:
    f.create_dataset('load', shape=(1, 2**31), chunks=(1, 1024), dtype='f8')
"
timeout -s KILL 60 "$ELDR" place profile --load huge.h5 -P 16 -R 2 >"$WORK/out.txt" 2>"$WORK/err.txt"
rc=$?
check_run "load of declared shape [1, 2^31]" fail \
  "huge.h5: /load is \[1, 2147483648\]; a load must be \[layers, experts\] with 1 <= layers <= 65535" &&
  ok "load of declared shape [1, 2^31]"
# Option ranges are the options' own errors, not the load file's.
for opt in "-P 0 -R 2" "-P 16 -R -4" "-P 16 -R 2 -N 0" "-P 16 -R 2 -G 0" "-P 16 -R 2147483648"; do
  expect_error "place profile $opt" "^eldr: error: --(slots|ranks|nodes|groups): must be an integer in \[1, [0-9]+\], got '(0|-4|2147483648)'" - \
    "$ELDR" place profile --load huge.h5 $opt
done

cp c.h5 target.h5
ln -s target.h5 link.h5
for cmd in "calibrate --trace t.h5 -K 2 --out link.h5" "trace synth --requests 4 --out link.h5" \
           "trace import --in g.jsonl --out link.h5" "calibrate --trace t.h5 -K 2 --out c2.h5 --report link.h5"; do
  expect_untouched "symlink: $cmd" "link.h5: cannot write: it is a symbolic link" target.h5 "$ELDR" $cmd
  [ -L link.h5 ] || bad "symlink: $cmd: link.h5 is no longer a link"
done
expect_error "stdout as --report (a link)" "/dev/stdout: cannot write: it is a symbolic link" c2.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --out c2.h5 --report /dev/stdout
mkdir adir
expect_error "directory as --out" "adir: cannot write: it is a directory" - "$ELDR" trace synth --requests 4 --out adir
[ -d adir ] || bad "adir is still a directory"

# ---- an output that is an input ----
mkdir sub
expect_untouched "calibrate --out = --trace" "t.h5: --out is the same file as the input --trace" t.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --out t.h5
expect_untouched "calibrate --out = --trace through ../" "--out is the same file as the input --trace" t.h5 \
  sh -c "cd sub && '$ELDR' calibrate --trace ../t.h5 -K 2 --out '../../$(basename "$WORK")/t.h5'"
expect_untouched "calibrate --out = --trace through sub/../" "--out is the same file as the input --trace" t.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --out sub/../t.h5
expect_untouched "calibrate --report = --trace" "t.h5: --report is the same file as the input --trace" t.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --out c2.h5 --report t.h5
[ -e c2.h5 ] && bad "--report = --trace left the calibration"
expect_untouched "refit --out = --refit" "c.h5: --out is the same file as the input --refit" c.h5 \
  "$ELDR" calibrate --refit c.h5 -K 2 --out c.h5
expect_error "calibrate --report = --out" "c2.h5: --report is the same file as the output --out" c2.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --out c2.h5 --report c2.h5
cp c.h5 c3.h5
expect_untouched "calibrate --report = --out (existing)" "--report is the same file as the output --out" c3.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --out c3.h5 --report ./sub/../c3.h5
expect_untouched "import --in = --out" "g.jsonl: --out is the same file as the input --in" g.jsonl \
  "$ELDR" trace import --in g.jsonl --out g.jsonl
expect_untouched "import --in = --out through a link" "--out is the same file as the input --in" g.jsonl \
  sh -c "ln -sf g.jsonl g_alias.jsonl && '$ELDR' trace import --in g_alias.jsonl --out ./g.jsonl"
expect_untouched "place evaluate --out = --trace" "t.h5: --out is the same file as the input --trace" t.h5 \
  "$ELDR" place evaluate --trace t.h5 --calib c.h5 -R 2 --out t.h5

# ---- simulate: the fitted cost model (-o) and the run directory ----
echo '{"kind":"prefill","worker":0,"time":0,"seconds":0.004,"prompt_tokens":8}' >steps.jsonl
expect_untouched "simulate --fit: -o = the step log" "steps.jsonl: --out is the same file as the input --fit" \
  steps.jsonl "$ELDR" simulate --fit steps.jsonl --model "$SRC/configs/models/tiny.yaml" -o steps.jsonl
expect_untouched "simulate --fit: -o = --model" "--out is the same file as the input --model" \
  "$SRC/configs/models/tiny.yaml" "$ELDR" simulate --fit steps.jsonl --model "$SRC/configs/models/tiny.yaml" \
  -o "$SRC/configs/models/tiny.yaml"
"$ELDR" trace synth --domains 3 --requests 30 --layers 2 --experts 8 --top-k 2 --prompt-len 8:24 --output-len 4:12 \
  --seed 2 --out tiny.h5 >/dev/null
cat >job.yaml <<YAML
topology: {prefill_ranks: 1, decode_ranks: 2}
model: {config: $SRC/configs/models/tiny.yaml, weights: synthetic, gate: replay}
routing: {policy: round_robin}
kv_cache: {block_size: 4, prefill_blocks: 256, decode_blocks: 256}
decode: {max_batch: 8}
workload: {trace: tiny.h5, num_requests: 30, request_rate: 50, seed: 1}
output: {dir: run}
simulate:
  decode: {a: 2.0e-3, b: 1.0e-4, c: 1.0e-5, d: 1.0e-7}
  prefill: {a: 1.0e-3, b: 1.0e-5}
  kv_transfer: {latency_s: 1.0e-4, bandwidth_Bps: 1.0e9}
  control_latency_s: 5.0e-5
YAML
# A run directory that holds files is refused (output.replace: false), and with output.replace: true one whose
# files are not a run's (a link) is refused too; a run file that is the input itself is refused by the output policy.
sed 's|^output: {dir: run}|output: {dir: run, replace: true}|' job.yaml > job-replace.yaml
mkdir run && ln -s ../target.h5 run/metrics.json
expect_untouched "simulate: metrics.json in the run directory is a link" "output.dir run already holds files" \
  target.h5 "$ELDR" simulate -c job.yaml --quiet
expect_untouched "simulate: metrics.json in the run directory is a link (output.replace)" \
  "output.dir run holds metrics.json, which is not a run's file" target.h5 "$ELDR" simulate -c job-replace.yaml --quiet
[ -e run/requests.jsonl ] && bad "simulate: a refused run directory got requests.jsonl"
rm run/metrics.json
echo '{"eldr_version": "earlier"}' > run/metrics.json  # an earlier run's, so that output.replace reaches the files
expect_untouched "simulate: requests.jsonl is the trace" "run/requests.jsonl: output.dir is the same file as the input trace" \
  tiny.h5 sh -c "ln tiny.h5 run/requests.jsonl && '$ELDR' simulate -c job-replace.yaml --quiet"
rm -rf run

# ---- a path given as "" (an unset variable in a script): refused, never taken for the option's default ----
expect_untouched "place calib --out '' (was: update --calib in place)" "--out: the path is empty" c.h5 \
  "$ELDR" place calib --calib c.h5 -P 16 -R 2 --out ""
expect_error "calibrate --out '' (was: refused only after the work)" "--out: the path is empty" - \
  "$ELDR" calibrate --trace t.h5 -K 2 --out "" --quiet
expect_error "calibrate --report '' (was: no report, exit 0)" "--report: the path is empty" c2.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --out c2.h5 --report "" --quiet
expect_error "place evaluate --out '' (was: no report, exit 0)" "--out: the path is empty" - \
  "$ELDR" place evaluate --trace t.h5 --calib c.h5 -R 2 --out ""
expect_error "simulate --trace '' (was: the config's trace)" "--trace: the path is empty" - \
  "$ELDR" simulate -c job.yaml --trace "" --no-output
expect_error "simulate --fit -o '' (was: stdout)" "--out: the path is empty" - \
  "$ELDR" simulate --fit steps.jsonl --model "$SRC/configs/models/tiny.yaml" -o ""
expect_error "trace stats ''" "trace: the path is empty" - "$ELDR" trace stats ""

# ---- messages ----
gzip -c g.jsonl >g.jsonl.gz
head -c $(( $(stat -c %s g.jsonl.gz) / 2 )) g.jsonl.gz >cut.jsonl.gz
expect_error "truncated gzip is reported as truncated" "cut.jsonl.gz:[0-9]+: .*truncated" cut.h5 \
  "$ELDR" trace import --in cut.jsonl.gz --out cut.h5
grep -q "JSON" "$WORK/err.txt" && bad "truncated gzip: the message must not blame the JSON"
# Data appended after the gzip stream was dropped by zlib without a word; concatenated members are one stream.
{ head -1 g.jsonl | gzip -c; tail -n +2 g.jsonl; } >app.jsonl.gz
expect_error "bytes after the gzip stream (was: imported 1 of 30 requests)" \
  "app.jsonl.gz: [0-9]+ bytes after the end of the gzip stream are not gzip data" app.h5 \
  "$ELDR" trace import --in app.jsonl.gz --out app.h5
{ head -1 g.jsonl | gzip -c; tail -n +2 g.jsonl | gzip -c; } >two.jsonl.gz
"$ELDR" trace import --in two.jsonl.gz --out two.h5 >/dev/null 2>&1 && "$ELDR" trace stats two.h5 --json >two.json \
  && /usr/bin/python3 -c 'import json; assert json.load(open("two.json"))["num_requests"] == 30' \
  && ok "two concatenated gzip members are one stream: 30 requests" || bad "two concatenated gzip members"
# The same appended bytes through a pipe (was: unchecked, since a pipe cannot be read a second time): now the one
# reading checks them.
expect_error "bytes after the gzip stream, from a pipe" "[0-9]+ bytes after the end of the gzip stream are not gzip data" \
  app.h5 "$ELDR" trace import --in <(cat app.jsonl.gz) --out app.h5
"$ELDR" trace import --in <(cat two.jsonl.gz) --out two_pipe.h5 >/dev/null 2>&1 && "$ELDR" trace stats two_pipe.h5 --json >two.json \
  && /usr/bin/python3 -c 'import json; assert json.load(open("two.json"))["num_requests"] == 30' \
  && ok "two gzip members from a pipe: 30 requests" || bad "two gzip members from a pipe"
PROFILE="$SRC/bench/data/expert-load-profiles/Qwen3-Coder-30B-A3B-Instruct_expert_scores_summary.json"
echo '{"num_layers": 48, "num_experts": 128, "num_ranks": 16, "phy2log": [0]}' >prev.json
expect_error "place profile --previous: a bad placement names the file" "^eldr: error: prev.json: " - \
  "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 --previous prev.json

# ---- a full disk: one line naming the file, no crash, no temporary ----
mkdir -p "$MNT"
if mount -t tmpfs -o size=40k tmpfs "$MNT" 2>/dev/null; then
  full_case() {  # NAME OUTPUT CMD...
    local name="$1" out="$2"; shift 2
    "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"
    rc=$?
    if check_run "$name" fail "$(basename "$out"): .*(No space left on device|write failed|cannot)"; then
      if [ -e "$out" ] || [ -n "$(temps_of "$out")" ]; then bad "$name" "left $(ls -a "$MNT" | tr '\n' ' ')"
      else ok "$name"; fi
    fi
    rm -rf "${MNT:?}"/* "$MNT"/.[!.]* 2>/dev/null
  }
  full_case "full disk: trace synth" "$MNT/s.h5" \
    "$ELDR" trace synth --requests 400 --layers 8 --experts 32 --top-k 4 --out "$MNT/s.h5"
  full_case "full disk: trace import" "$MNT/real.h5" \
    "$ELDR" trace import --in "$SRC/tests/data/esft-deepseek-v2-lite/routing.jsonl.gz" --out "$MNT/real.h5"
  "$ELDR" trace synth --requests 300 --layers 8 --experts 32 --top-k 4 --prompt-len 16 --output-len 16 --out big.h5 >/dev/null
  full_case "full disk: calibrate" "$MNT/c.h5" "$ELDR" calibrate --trace big.h5 -K 2 --out "$MNT/c.h5" --quiet
  # The report fits, the calibration does not: neither is left (all or none).
  full_case "full disk: calibrate, report and calibration all or none" "$MNT/c.h5" \
    "$ELDR" calibrate --trace big.h5 -K 2 --out "$MNT/c.h5" --report "$MNT/r.json" --quiet
  [ -e "$MNT/r.json" ] && bad "full disk: the report was left without the calibration"
  # Almost nothing left: the failure comes at the first write or at the close.
  dd if=/dev/zero of="$MNT/filler" bs=1k count=36 status=none 2>/dev/null
  full_case "nearly full disk: trace synth" "$MNT/s.h5" "$ELDR" trace synth --requests 20 --out "$MNT/s.h5"
  dd if=/dev/zero of="$MNT/filler" bs=1k count=36 status=none 2>/dev/null
  full_case "nearly full disk: calibrate" "$MNT/c.h5" "$ELDR" calibrate --trace t.h5 -K 2 --out "$MNT/c.h5" --quiet
  # A simulation whose outputs do not fit: one line, and not even the output directory it created is left.
  "$ELDR" simulate -c job.yaml -n 3000 --output-dir "$MNT/deep/run" --quiet >"$WORK/out.txt" 2>"$WORK/err.txt"
  rc=$?
  if check_run "full disk: simulate leaves no run directory" fail "deep/run/(requests.jsonl|metrics.json): .*No space left on device"; then
    [ -e "$MNT/deep" ] && bad "full disk: simulate leaves no run directory" "left $(ls -a "$MNT/deep")" ||
      ok "full disk: simulate leaves no run directory"
  fi
  umount "$MNT"
else
  echo "skip   full-disk cases (mounting a tmpfs needs root)"
fi

# ---- damaged files and impossible values (stop 28's hostile probe): one line, no crash, nothing written ----
# A global-heap object whose size field is corrupted: libhdf5 1.10 copies by it unchecked (exit 139, h5dump too).
# The root attributes' strings share the ids' heap collection, so the first string read from it is refused.
cp t.h5 heap.h5
/usr/bin/python3 - <<'PYEOF'
import h5py, struct
with h5py.File("heap.h5", "r") as f:
    victim = f["/requests/id"][5].decode()
data = bytearray(open("heap.h5", "rb").read())
at = data.find(victim.encode())
assert at > 8 and struct.unpack_from("<Q", data, at - 8)[0] == len(victim), "unexpected heap layout"
struct.pack_into("<Q", data, at - 8, 0x7FFFFFFFFFFFFFFF)
open("heap.h5", "wb").write(data)
PYEOF
expect_error "trace stats: a corrupted string heap (was: segfault)" "heap.h5: the strings? of .* outside (its|their) heap" - \
  "$ELDR" trace stats heap.h5
expect_error "calibrate: a corrupted string heap (was: segfault)" "heap.h5: the strings? of .* outside (its|their) heap" hc.h5 \
  "$ELDR" calibrate --trace heap.h5 -K 2 --out hc.h5 --quiet
# The same for a string attribute (its value is in the global heap too), and an attribute of 50 values where one
# is read (H5Aread writes all 50 into one: a segfault), and an attribute that is not UTF-8.
cp c.h5 aheap.h5
/usr/bin/python3 - <<'PYEOF'
import h5py, shutil, struct, numpy as np
data = bytearray(open("aheap.h5", "rb").read())
at = data.find(b"eldr-calibration")
assert at > 8 and struct.unpack_from("<Q", data, at - 8)[0] == len("eldr-calibration"), "unexpected heap layout"
struct.pack_into("<Q", data, at - 8, 0x7FFFFFFFFFFFFFFF)
open("aheap.h5", "wb").write(data)
for name, key, value in [("a50.h5", "num_layers", np.arange(50, dtype=np.int64)),
                         ("s50.h5", "model", np.array(["m"] * 50, dtype=h5py.string_dtype())),
                         ("autf.h5", "model", np.bytes_(b"ab\xffcd"))]:
    shutil.copy("c.h5", name)
    with h5py.File(name, "r+") as f: f.attrs[key] = value
PYEOF
expect_error "inspect: a corrupted attribute string heap (was: segfault)" \
  "aheap.h5: the string of attribute /@format points outside its heap" - "$ELDR" inspect aheap.h5
expect_error "route: a corrupted attribute string heap (was: segfault)" "aheap.h5: the string of attribute /@format" - \
  "$ELDR" route --calib aheap.h5 --trace t.h5
expect_error "inspect: an integer attribute of 50 values (was: segfault)" \
  "a50.h5: attribute /@num_layers must hold one value, not 50" - "$ELDR" inspect a50.h5
expect_error "inspect: a string attribute of 50 values (was: segfault)" \
  "s50.h5: attribute /@model must hold one value, not 50" - "$ELDR" inspect s50.h5
expect_error "inspect: an attribute that is not UTF-8" "autf.h5: attribute /@model is not valid UTF-8" - \
  "$ELDR" inspect autf.h5
/usr/bin/python3 - <<'PYEOF'
import h5py, numpy as np, shutil
for name, edit in [("nofmt.h5", lambda f: f.attrs.__delitem__("format")),
                   ("nover.h5", lambda f: f.attrs.__delitem__("format_version"))]:
    shutil.copy("t.h5", name)
    with h5py.File(name, "r+") as f: edit(f)
def set_id(f):
    ids = f["/requests/id"][:]
    del f["/requests/id"]
    ids[2] = b"ab\xffcd"
    f.create_dataset("/requests/id", data=ids, dtype=h5py.string_dtype("utf-8"))
shutil.copy("t.h5", "utf8.h5")
with h5py.File("utf8.h5", "r+") as f: set_id(f)
for name, edit in [("dupid.h5", "dup"), ("nobal.h5", "nobal"), ("zeroc.h5", "norm")]:
    shutil.copy("c.h5", name)
    with h5py.File(name, "r+") as f:
        if edit == "dup":
            ids = f["/calibration/request_ids"][:]; ids[1] = ids[0]
            del f["/calibration/request_ids"]
            f.create_dataset("/calibration/request_ids", data=ids, dtype=h5py.string_dtype("utf-8"))
        elif edit == "nobal":
            del f["/clusters"].attrs["balanced"]
        else:
            f["/clusters/centroids"][...] = 0.5  # rows of norm != 1
PYEOF
expect_error "trace without its format attribute (was: read anyway)" "nofmt.h5: not an eldr routing trace" - \
  "$ELDR" trace stats nofmt.h5
expect_error "trace without format_version (was: read anyway)" "nover.h5: trace without the root attribute format_version" - \
  "$ELDR" trace stats nover.h5
expect_error "request id not UTF-8 (was: rewritten with U+FFFD)" "utf8.h5: /requests/id entry 2 is not valid UTF-8" - \
  "$ELDR" trace stats utf8.h5
expect_error "calibration with a duplicate request id" "dupid.h5: .*request_ids holds .* twice" - "$ELDR" inspect dupid.h5
expect_error "calibration without /clusters@balanced (was: defaulted)" "nobal.h5: missing attribute /clusters@balanced" - \
  "$ELDR" inspect nobal.h5
expect_error "calibration whose centroids are not unit vectors" "zeroc.h5: .*centroids row 0 has norm" - "$ELDR" inspect zeroc.h5
# Invariants of a calibration that hold by construction (DESIGN.md §5), each broken by hand: inspect and route
# refuse the file instead of routing by it.
"$ELDR" calibrate --trace t.h5 -K 2 --layers 2 --out c2l.h5 --quiet || bad "calibrate with --layers 2"
/usr/bin/python3 - <<'PYEOF'
import h5py, shutil, numpy as np
def edit(src, name, change):
    shutil.copy(src, name)
    with h5py.File(name, "r+") as f: change(f)
def swap_mask(f):
    order, mask = f["/signature/layer_order"][:], f["/signature/layer_mask"][:]
    mask[order[1]], mask[order[2]] = 0, 1  # still 2 layers, not the first two of the order
    f["/signature/layer_mask"][...] = mask
edit("c2l.h5", "nprefix.h5", swap_mask)
edit("c.h5", "signeg.h5", lambda f: f["/calibration/signatures"].write_direct(-f["/calibration/signatures"][:]))
edit("c.h5", "sigx7.h5", lambda f: f["/calibration/signatures"].write_direct(7 * f["/calibration/signatures"][:]))
edit("c.h5", "load.h5", lambda f: f["/clusters/expert_load"].write_direct(0.1 * f["/clusters/expert_load"][:]))
edit("c.h5", "mdl.h5", lambda f: f["/clusters/mean_decode_len"].write_direct(100 * f["/clusters/mean_decode_len"][:]))
edit("c.h5", "nomdl.h5", lambda f: f["/clusters"].__delitem__("mean_decode_len"))
edit("c.h5", "bal7.h5", lambda f: f["/clusters"].attrs.__setitem__("balanced", np.int64(7)))
def rho(f):
    r = f["/signature/rho_curve"][:]; r[0] = 5.0
    f["/signature/rho_curve"][...] = r
edit("c.h5", "rho5.h5", rho)
def mask7(f):
    m = f["/signature/layer_mask"][:]; m[m == 1] = 7
    f["/signature/layer_mask"][...] = m
edit("c.h5", "mask7.h5", mask7)
edit("c.h5", "topk3.h5", lambda f: f.attrs.__setitem__("top_k", np.int64(f.attrs["top_k"] + 1)))
def noprof(f):  # without the members' profiles, the cluster means alone are checked against top_k
    del f["/calibration/decode_profiles"]
    f.attrs["top_k"] = np.int64(f.attrs["top_k"] + 1)
edit("c.h5", "topk3np.h5", noprof)
edit("t.h5", "w0.h5", lambda f: f["/tokens/topk_weights"].write_direct(0 * f["/tokens/topk_weights"][:]))
PYEOF
expect_error "calibration: a layer mask value of 7 (was: read as selected)" \
  "mask7.h5: /signature/layer_mask has a value 7: each layer's is 0 or 1" - "$ELDR" inspect mask7.h5
expect_error "calibration: top_k attribute contradicting the decode profiles (was: accepted)" \
  "topk3.h5: /calibration/decode_profiles of request .* layer 0 sums to [0-9.]+, not top_k = [0-9]+" - "$ELDR" inspect topk3.h5
expect_error "calibration without profiles: top_k contradicting the cluster loads" \
  "topk3np.h5: /clusters/expert_load cluster 0 layer 0 sums to [0-9.]+, not top_k = [0-9]+" - \
  "$ELDR" calibrate --refit topk3np.h5 -K 2 --out never.h5
[ -e never.h5 ] && bad "refused refit left no output" "never.h5 exists"
expect_error "gate_prob signatures on gate weights that are all 0 (was: calibrated on NaN)" \
  "every request's gate_prob signature is all zeros: the trace's /tokens/topk_weights are all 0" - \
  "$ELDR" calibrate --trace w0.h5 -K 2 --signature gate_prob --out never.h5
expect_error "calibration: a layer mask that is not the greedy order's prefix" \
  "nprefix.h5: /signature/layer_mask is not the first 2 layers of /signature/layer_order" - "$ELDR" inspect nprefix.h5
expect_error "calibration: negative signatures" "signeg.h5: /calibration/signatures row [0-9]+ has a negative value" - \
  "$ELDR" route --calib signeg.h5 --trace t.h5
expect_error "calibration: signatures of norm 7" "sigx7.h5: /calibration/signatures row [0-9]+ has norm 7.0" - \
  "$ELDR" inspect sigx7.h5
expect_error "calibration: expert_load that is not its members' mean" \
  "load.h5: /clusters/expert_load is not the mean of its members' /calibration/decode_profiles" - \
  "$ELDR" route --calib load.h5 --trace t.h5
expect_error "calibration: cluster decode means that are not their members'" \
  "mdl.h5: /clusters/mean_decode_len\[0\] = .* is not the mean of its members' /calibration/decode_lens" - \
  "$ELDR" inspect mdl.h5
expect_error "calibration: the decode means removed" \
  "nomdl.h5: /calibration/decode_lens is stored but /clusters/mean_decode_len is not" - "$ELDR" inspect nomdl.h5
expect_error "calibration: balanced = 7" "bal7.h5: /clusters balanced and work_balanced are flags \(0 or 1\), got 7" - \
  "$ELDR" inspect bal7.h5
expect_error "calibration: rho 5" "rho5.h5: /signature/rho_curve has a value outside \[-1, 1\]" - "$ELDR" inspect rho5.h5

# A trace whose /requests claim 2^40 rows (declared, never written): named, before anything is allocated for them.
# Weights of another shape are refused by calibrate too, which does not read them.
/usr/bin/python3 - <<'PYEOF'
import h5py, shutil, numpy as np
shutil.copy("t.h5", "reqhuge.h5")
with h5py.File("reqhuge.h5", "r+") as f:
    for name in ("prompt_len", "num_tokens", "offset"):
        del f["/requests/" + name]
        f.create_dataset("/requests/" + name, shape=(2**40,), dtype="i8", chunks=(1024,))
shutil.copy("t.h5", "wstr.h5")
with h5py.File("wstr.h5", "r+") as f:
    del f["/tokens/topk_weights"]
    f["/tokens/topk_weights"] = "not weights"
PYEOF
expect_error "trace: /requests of 2^40 rows (was: out of memory)" \
  "reqhuge.h5: /requests/prompt_len has 1099511627776 requests, more than the [0-9]+ tokens of /tokens/topk_ids" - \
  "$ELDR" trace stats reqhuge.h5
expect_error "calibrate: weights of another shape (was: accepted)" "wstr.h5: /tokens/topk_weights shape differs" wc.h5 \
  "$ELDR" calibrate --trace wstr.h5 -K 2 --out wc.h5

# Options that cannot give a meaningful result, refused up front.
expect_error "synth --like --requests 2^62 (was: ran until the disk filled)" \
  "--requests 4611686018427387904 of about [0-9]+ tokens each .* lower --requests or --length-jitter$" big-like.h5 \
  "$ELDR" trace synth --like t.h5 --requests 4611686018427387904 --out big-like.h5
expect_error "calibrate --max-pairs 5 (was: rho from 5 pairs)" "--max-pairs 5 is too few for a rank correlation" mp.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --max-pairs 5 --out mp.h5
expect_error "calibrate --holdout 0.05 of 40 (2 held out: was: rho null)" \
  "--holdout 0.050 holds out only 2 of 40 requests; a held-out rho needs 3" ho.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --holdout 0.05 --out ho.h5
expect_error "calibrate --quiet --json (was: --json ignored)" "--json excludes --quiet" qj.h5 \
  "$ELDR" calibrate --trace t.h5 -K 2 --quiet --json --out qj.h5
expect_error "route --policy jsq --max-batch (eldr's price)" "--max-batch does not apply to policy jsq" - \
  "$ELDR" route --calib c.h5 --trace t.h5 --policy jsq --max-batch 8
expect_error "synth --model that is not UTF-8 (was: a trace no reader accepts)" \
  "bad-model.h5: attribute /@model is not valid UTF-8" bad-model.h5 \
  "$ELDR" trace synth --requests 4 --model "$(printf 'a\377')" --out bad-model.h5
cp "$SRC/configs/models/tiny.yaml" model-copy.yaml
expect_untouched "simulate --derive: -o = --model (was: overwrote it)" "--out is the same file as the input --model" \
  model-copy.yaml "$ELDR" simulate --derive h200 --model model-copy.yaml -o model-copy.yaml
expect_error "simulate --derive into a missing directory: the error is the first line" "nodir/d.yaml: cannot write" - \
  "$ELDR" simulate --derive h200 --model model-copy.yaml -o nodir/d.yaml
echo '{"kind":"decode","worker":0,"time":0.01,"seconds":0.002,"batch":-3,"distinct_experts":6,"context_tokens":72}' >neg.jsonl
expect_error "simulate --fit: a negative batch (was: fitted)" "neg.jsonl:1: .*batch must be an integer in \[1," fit-neg.yaml \
  "$ELDR" simulate --fit neg.jsonl --model "$SRC/configs/models/tiny.yaml" -o fit-neg.yaml
echo '{"kind":"decode","worker":0,"time":0.01,"seconds":0.002,"batch":3,"distinct_experts":99999,"context_tokens":72}' >big.jsonl
expect_error "simulate --fit: more distinct experts than the model has" "big.jsonl:1: .*distinct_experts must be an integer in \[0, " \
  fit-big.yaml "$ELDR" simulate --fit big.jsonl --model "$SRC/configs/models/tiny.yaml" -o fit-big.yaml
expect_error "route --rate 1e-20 (was: never ended)" "the arrivals span .* raise --rate" - \
  timeout 60 "$ELDR" route --calib c.h5 --trace t.h5 --policy jsq --rate 1e-20
expect_error "route --step-ms 1e-20 (was: never ended)" "decode steps of 1e-20 ms" - \
  timeout 60 "$ELDR" route --calib c.h5 --trace t.h5 --policy jsq --step-ms 1e-20
expect_error "simulate --no-output with --output-dir (was: ignored)" "--no-output writes no files" - \
  "$ELDR" simulate -c job.yaml --no-output --output-dir elsewhere
expect_error "serve --print-ranks checks its overrides" "unknown routing policy 'foo'" - \
  "$ELDR" serve -c job.yaml --print-ranks --policy foo
head -1 g.jsonl | tr -d '\n' >nul.jsonl && printf '\0\n' >>nul.jsonl
expect_error "trace import: a NUL byte after the record (was: ignored)" "nul.jsonl:1: a NUL byte at column" nul.h5 \
  "$ELDR" trace import --in nul.jsonl --out nul.h5
/usr/bin/python3 -c "
import json; d = json.load(open('$PROFILE')); d['tokens_scores'] = {}; json.dump(d, open('typo-profile.json', 'w'))"
expect_error "place profile: an unknown key in the load profile (was: ignored)" "typo-profile.json: unknown key \"tokens_scores\"" - \
  "$ELDR" place profile --load typo-profile.json -P 160 -R 16
# Round two of the probe: the environment, heavy-tailed lengths, moved bytes, --previous entries, inspect, eldr-launch.
for v in 0 -1 abc 2x 1e3 99999999999999999999 ""; do
  expect_error "ELDR_NUM_THREADS='$v' (was: the hardware count)" "ELDR_NUM_THREADS='$v' must be a whole number in \[1, 4096\]" \
    envc.h5 env ELDR_NUM_THREADS="$v" "$ELDR" calibrate --trace t.h5 -K 2 --out envc.h5 --quiet
done
for v in abc -1 0 10X 1.5G ""; do
  expect_error "ELDR_MEMORY_BUDGET='$v' (was: misread)" "ELDR_MEMORY_BUDGET='$v' must be a whole number of bytes" envm.h5 \
    env ELDR_MEMORY_BUDGET="$v" "$ELDR" calibrate --trace t.h5 -K 2 --out envm.h5 --quiet
done
expect_error "ELDR_MEMORY_BUDGET=10K is 10 KiB" "needs .*, this machine has 10.2 KB|needs .* this machine has 10240 B" - \
  env ELDR_MEMORY_BUDGET=10K "$ELDR" trace synth --requests 400 --layers 8 --experts 32 --top-k 4 --out budget.h5
env ELDR_NUM_THREADS=1 ELDR_MEMORY_BUDGET=8G "$ELDR" calibrate --trace t.h5 -K 2 --out envok.h5 --quiet &&
  ok "valid ELDR_NUM_THREADS and ELDR_MEMORY_BUDGET" || bad "valid ELDR_NUM_THREADS and ELDR_MEMORY_BUDGET"
expect_error "synth --like --length-jitter 5 (was: OOM kill)" \
  "--length-jitter 5.* drew a request of .* tokens|--length-jitter 5.*: needs|--length-jitter 5\.00\) is about .* lower --requests or --length-jitter" \
  jit.h5 env ELDR_MEMORY_BUDGET=64M "$ELDR" trace synth --like t.h5 --requests 2000 --length-jitter 5 --out jit.h5
echo '{"token_scores": {"0": {"0": 5, "1": 1, "2": 1, "3": 1}, "1": {"0": 1, "1": 1, "2": 1, "3": 5}}}' >p4.json
echo '{"token_scores": {"0": {"0": 0, "1": 0}, "1": {"0": 0, "1": 0}}}' >p0.json
expect_error "place profile of loads that are all 0 (was: balancedness 1.0000)" \
  "p0.json: every load is 0, so there is nothing to balance" - "$ELDR" place profile --load p0.json -P 2 -R 2
echo '{"id": "a", "num_layers": 1, "num_experts": 4, "top_k": 1, "num_tokens": 9223372036854775808, "prompt_len": 1, "topk_ids": [[[0]]]}' >t63.jsonl
expect_error "import: num_tokens of 2^63 (was: 'must be positive')" \
  "t63.jsonl:1: field 'num_tokens' = 9223372036854775808 is out of range" t63.h5 "$ELDR" trace import --in t63.jsonl --out t63.h5
"$ELDR" place profile --load p4.json -P 6 -R 2 --json >p4-place.json 2>/dev/null
/usr/bin/python3 - <<'PYEOF'
import json
j = json.load(open("p4-place.json"))
j["phy2log"] = j["phy2log"][::-1]
del j["logcnt"], j["log2phy"]  # they would contradict the edited phy2log (refused)
json.dump(j, open("p4-rev.json", "w"))
j["phy2log"][0] = 2 ** 70
json.dump(j, open("p4-big.json", "w"))
j["phy2log"][0] = 1.5
json.dump(j, open("p4-half.json", "w"))
PYEOF
"$ELDR" place profile --load p4.json -P 6 -R 2 --previous p4-rev.json --expert-bytes 1000000000000000000 --json >mb.json 2>"$WORK/err.txt" &&
  /usr/bin/python3 -c "
import json; j = json.load(open('mb.json')); assert j['moved_experts'] > 0 and j['moved_bytes'] == j['moved_experts'] * 1e18, j" &&
  ok "moved bytes past 2^63 (was: 0 in JSON, negative in text)" || bad "moved bytes past 2^63" "$(cat "$WORK/err.txt")"
expect_error "place --previous: a phy2log entry of 2^70 (was: reported as -2147483648)" "p4-big.json: phy2log\[0\] = 1.18059[0-9]*e\+21 is not an expert id" - \
  "$ELDR" place profile --load p4.json -P 6 -R 2 --previous p4-big.json
expect_error "place --previous: a phy2log entry of 1.5 (was: read as 1)" "p4-half.json: phy2log\[0\] = 1.5 is not an expert id" - \
  "$ELDR" place profile --load p4.json -P 6 -R 2 --previous p4-half.json
"$ELDR" place calib --calib c.h5 -P 16 -R 2 --out placed.h5 >/dev/null 2>&1
/usr/bin/python3 -c "
import h5py; f = h5py.File('placed.h5', 'r+'); d = f['/placement/global/phy2log']; x = d[...]; x[0, 0] = 999; d[...] = x"
expect_error "inspect: a damaged /placement (was: ignored)" "placed.h5: .*phy2log" - "$ELDR" inspect placed.h5
expect_error "eldr-launch --launcher without a value (was: a bash error)" "eldr-launch: --launcher needs a value" - \
  "$SRC/launch/eldr-launch" job.yaml --launcher
expect_error "eldr-launch --kill-delay 0" "eldr-launch: --kill-delay must be a whole number of seconds in \[1, 600\], got '0'" - \
  "$SRC/launch/eldr-launch" job.yaml --kill-delay 0
# mpirun's int would silently become its default of 1 s.
expect_error "eldr-launch --kill-delay 99999999999" "--kill-delay must be a whole number of seconds in \[1, 600\], got '99999999999'" - \
  "$SRC/launch/eldr-launch" job.yaml --kill-delay 99999999999
expect_error "eldr-launch --kill-delay 601" "got '601'" - "$SRC/launch/eldr-launch" job.yaml --kill-delay 601
if ELDR="$ELDR" "$SRC/launch/eldr-launch" job.yaml --kill-delay 4 2>/dev/null | grep -q -- "--mca odls_base_sigkill_timeout 4 "; then
  ok "eldr-launch --kill-delay 4: mpirun's odls_base_sigkill_timeout 4"
else bad "eldr-launch --kill-delay 4" "$(ELDR="$ELDR" "$SRC/launch/eldr-launch" job.yaml --kill-delay 4 2>&1 | tail -2)"; fi
expect_error "eldr-launch DIR" "eldr-launch: sub0: is a directory" - sh -c "mkdir -p sub0 && '$SRC/launch/eldr-launch' sub0"

# A relative output.dir is the config's directory's, as its inputs are (was: the working directory's).
mkdir -p sub && sed "s|^workload: {trace: tiny.h5|workload: {trace: $WORK/tiny.h5|" job.yaml >sub/job.yaml
if "$ELDR" simulate -c sub/job.yaml --quiet >/dev/null 2>"$WORK/err.txt" && [ -e sub/run/metrics.json ] && [ ! -e run ]; then
  ok "output.dir relative to the config file"
else
  bad "output.dir relative to the config file" "$(cat "$WORK/err.txt") $(ls)"
fi
rm -rf sub

# ---- signals: 128 + signal, one line, no temporary ----
# Import from a FIFO: the input is written, the temporary appears while the import waits for the end of the input,
# the signal is sent, then the input ends (the line loop or the writer sees the signal).
wait_for_temp() {  # OUTPUT PID: until OUTPUT's temporary exists (or PID ended)
  for _ in $(seq 1 400); do
    [ -n "$(temps_of "$1")" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
for sig in INT TERM HUP; do
  rm -f in.fifo && mkfifo in.fifo
  "$ELDR" trace import --in in.fifo --out imp.h5 >"$WORK/out.txt" 2>"$WORK/err.txt" &
  pid=$!
  exec 3>in.fifo
  cat long.jsonl >&3
  if wait_for_temp imp.h5 $pid; then
    kill -s $sig $pid
    sleep 0.2
  fi
  exec 3>&-
  wait $pid
  rc=$?
  want=$((128 + $(kill -l $sig)))
  if check_run "SIG$sig during import" $want "interrupted by SIG$sig"; then
    if [ -e imp.h5 ] || [ -n "$(temps_of imp.h5)" ]; then bad "SIG$sig during import" "output or temporary left"
    else ok "SIG$sig during import"; fi
  fi
done
# A long synth: the signal arrives while it writes (its temporary exists).
for sig in INT TERM HUP; do
  "$ELDR" trace synth --requests 3000 --layers 8 --experts 32 --top-k 4 --prompt-len 64 --output-len 64 \
    --out s.h5 >"$WORK/out.txt" 2>"$WORK/err.txt" &
  pid=$!
  if wait_for_temp s.h5 $pid; then kill -s $sig $pid; fi
  wait $pid
  rc=$?
  want=$((128 + $(kill -l $sig)))
  if check_run "SIG$sig during synth" $want "interrupted by SIG$sig"; then
    if [ -e s.h5 ] || [ -n "$(temps_of s.h5)" ]; then bad "SIG$sig during synth" "output or temporary left"
    else ok "SIG$sig during synth"; fi
  fi
done
# Before any file exists (the synthesis itself polls the signal too).
"$ELDR" trace synth --requests 3000 --layers 8 --experts 32 --top-k 4 --prompt-len 64 --output-len 64 \
  --out s.h5 >"$WORK/out.txt" 2>"$WORK/err.txt" &
pid=$!
sleep 0.3
kill -s INT $pid
wait $pid
rc=$?
if check_run "SIGINT during the synthesis" 130 "interrupted by SIGINT"; then
  if [ -e s.h5 ] || [ -n "$(temps_of s.h5)" ]; then bad "SIGINT during the synthesis" "output or temporary left"
  else ok "SIGINT during the synthesis"; fi
fi

# A signal before main (while the shared libraries initialise, ~0.1 s): recorded from the process's first instant
# (.preinit_array), so the command ends with the interrupt's line, not silently at the signal's default action.
# ELDR_PENDING_SIGNAL=N makes the process send itself N there; --help and a bad option alike give way to it.
for args in "trace synth --requests 4 --out early.h5" "trace synth --help" "trace synth --no-such-option"; do
  for sig in TERM INT HUP; do
    ELDR_PENDING_SIGNAL=$(kill -l $sig) "$ELDR" $args >"$WORK/out.txt" 2>"$WORK/err.txt"
    rc=$?
    if check_run "SIG$sig before main: eldr $args" $((128 + $(kill -l $sig))) "^eldr: interrupted by SIG$sig\$"; then
      if [ -e early.h5 ] || [ -s "$WORK/out.txt" ]; then bad "SIG$sig before main: eldr $args" "output written"
      else ok "SIG$sig before main: eldr $args"; fi
    fi
  done
done

# A signal the caller had ignored (nohup's SIGHUP) stays ignored: the process's own SIGHUP at its start changes
# nothing, and the command runs to its end.
(trap '' HUP; ELDR_PENDING_SIGNAL=$(kill -l HUP) exec "$ELDR" trace synth --requests 4 --out nohup.h5) \
  >"$WORK/out.txt" 2>"$WORK/err.txt"
rc=$?
if [ "$rc" = 0 ] && [ -s nohup.h5 ] && [ ! -s "$WORK/err.txt" ]; then ok "SIGHUP ignored by the caller (nohup): still ignored"
else bad "SIGHUP ignored by the caller (nohup): still ignored" "rc=$rc $(cat "$WORK/err.txt")"; fi

# A long calibration (k-means restarts poll the signal): neither the calibration nor the report is left.
"$ELDR" trace synth --requests 3000 --layers 8 --experts 32 --top-k 4 --prompt-len 16 --output-len 16 --out mid.h5 >/dev/null
"$ELDR" calibrate --trace mid.h5 -K 8 --restarts 30 --out cm.h5 --report cm.json --quiet >"$WORK/out.txt" 2>"$WORK/err.txt" &
pid=$!
sleep 1
kill -s HUP $pid
wait $pid
rc=$?
if check_run "SIGHUP during calibrate" 129 "cm.h5: interrupted by SIGHUP"; then
  if [ -e cm.h5 ] || [ -e cm.json ] || [ -n "$(temps_of cm.h5)$(temps_of cm.json)" ]; then
    bad "SIGHUP during calibrate" "output or temporary left"
  else ok "SIGHUP during calibrate"; fi
fi

# A long placement (each layer of E = 2048 experts into 32768 slots on 1024 ranks takes about a second) stops
# between layers: place calib leaves neither its output nor a temporary.
"$ELDR" trace synth --requests 200 --layers 4 --experts 2048 --top-k 8 --prompt-len 16 --output-len 16 \
  --out wide.h5 >/dev/null && "$ELDR" calibrate --trace wide.h5 -K 2 --out wide_c.h5 --quiet
"$ELDR" place calib --calib wide_c.h5 --out wide_p.h5 -P 32768 -R 1024 >"$WORK/out.txt" 2>"$WORK/err.txt" &
pid=$!
sleep 1
kill -s INT $pid
wait $pid
rc=$?
if check_run "SIGINT during place calib" 130 "wide_p.h5: interrupted by SIGINT"; then
  if [ -e wide_p.h5 ] || [ -n "$(temps_of wide_p.h5)" ]; then bad "SIGINT during place calib" "output or temporary left"
  else ok "SIGINT during place calib"; fi
fi

# Nothing else was left in the work directory.
stray=$(ls -a | grep "\.tmp\." || true)
[ -z "$stray" ] && ok "no temporary anywhere" || bad "no temporary anywhere" "$stray"
finish
