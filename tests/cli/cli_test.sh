#!/usr/bin/env bash
# End-to-end tests of the eldr binary: the offline pipeline on the bundled real trace, the file formats
# as h5dump and h5py read them, and every bad input of the foundation issue (one clear line on stderr,
# non-zero exit, no output file).
# Usage: cli_test.sh /path/to/eldr /path/to/source
set -u
ELDR="$1"
SRC="$2"
PY=/usr/bin/python3  # Debian's python, where python3-h5py is installed
export ELDR_SRC="$SRC"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
source "$SRC/tests/lib.sh"

# ---- help and version ----
run_ok "--version" "$ELDR" --version
grep -q "^eldr " "$WORK/out.txt" || bad "--version prints the version"
for sub in "trace import" "trace synth" "trace stats" "calibrate" "inspect" "route" "serve" "place" "place profile" \
  "place calib" "place evaluate" "simulate"; do
  run_ok "help: $sub" $ELDR $sub --help
done

# ---- the offline pipeline on the bundled real trace ----
run_ok "import the bundled real trace" "$ELDR" trace import --in "$SRC/tests/data/esft-deepseek-v2-lite/routing.jsonl.gz" --out real.h5
run_ok "trace stats" "$ELDR" trace stats real.h5
run_ok "trace stats --json" "$ELDR" trace stats real.h5 --json
$PY -c "import json,sys; j=json.load(open('$WORK/out.txt')); assert j['num_requests']==108, j['num_requests']" \
  && ok "stats JSON parses, 108 requests" || bad "stats JSON parses"
run_ok "calibrate K=4" "$ELDR" calibrate --trace real.h5 --decoders 4 --out calib.h5 --holdout 0.2 --report report.json
run_ok "inspect" "$ELDR" inspect calib.h5
run_ok "inspect --json" "$ELDR" inspect calib.h5 --json
run_ok "inspect --trace" "$ELDR" inspect calib.h5 --trace real.h5
run_ok "refit K=2" "$ELDR" calibrate --refit calib.h5 --decoders 2 --out calib2.h5
run_ok "synth" "$ELDR" trace synth --domains 3 --requests 60 --layers 4 --experts 16 --top-k 2 --prompt-len 8:16 --output-len 8 --mix wildchat --seed 1 --out syn.h5
run_ok "calibrate synthetic, unbalanced, fixed layers" "$ELDR" calibrate --trace syn.h5 -K 3 --layers 2 --balance none --signature binary --out syn_calib.h5

run_ok "route, every policy" "$ELDR" route --calib calib.h5 --trace real.h5
for p in random round_robin jsq p2c domain locality_top1 eldr; do grep -q "^$p " "$WORK/out.txt" || bad "route lists $p"; done
run_ok "route --json, one policy" "$ELDR" route --calib calib.h5 --trace real.h5 --policy eldr_paper --tau 0.2 --json
$PY -c "import json; j=json.load(open('$WORK/out.txt')); p=j['policies'][0]; assert p['policy']=='eldr_paper' and p['tau']==0.2; assert sum(d['requests'] for d in p['decoders'])==108" \
  && ok "route JSON accounts for every request" || bad "route JSON accounts for every request"
# A report that cannot be written to stdout (a full disk) is a failed run: one line, exit 1, not exit 0.
if [ -w /dev/full ]; then
  expect_error "route --json > /dev/full" "^eldr: error: stdout: the output could not be written" - \
    sh -c "'$ELDR' route --calib calib.h5 --trace real.h5 --json > /dev/full"
  expect_error "trace stats > /dev/full" "^eldr: error: stdout: the output could not be written" - \
    sh -c "'$ELDR' trace stats real.h5 > /dev/full"
  for what in --help "route --help" --version; do  # were exit 0 with nothing printed
    expect_error "eldr $what > /dev/full" "^eldr: error: stdout: the output could not be written" - \
      sh -c "'$ELDR' $what > /dev/full"
  done
fi
# route's --calib is required (its K is the decoder count): never refused; --tau with one policy that has no band is.
run_ok "route --policy jsq (the calibration gives K)" "$ELDR" route --calib calib.h5 --trace real.h5 --policy jsq
expect_error "route --policy jsq --tau" "--tau does not apply to policy jsq" - \
  "$ELDR" route --calib calib.h5 --trace real.h5 --policy jsq --tau 0.2

# ---- eldr place on a real expert-load profile ----
PROFILE="$SRC/bench/data/expert-load-profiles/Qwen3-Coder-30B-A3B-Instruct_expert_scores_summary.json"
run_ok "place eldr" "$ELDR" place profile --load "$PROFILE" --algorithm eldr -P 160 -R 16 -N 2 -G 8 --json
cp "$WORK/out.txt" place_eldr.json
run_ok "place deepseek-hierarchical" "$ELDR" place profile --load "$PROFILE" --algorithm deepseek-hierarchical -P 160 -R 16 -N 2 -G 8 --json
$PY - "$WORK/place_eldr.json" "$WORK/out.txt" <<'PYEOF'
import json, sys
e, d = (json.load(open(p)) for p in sys.argv[1:3])
L, E, P, R = e["num_layers"], e["num_experts"], e["num_slots"], e["num_ranks"]
assert (L, E, P, R) == (48, 128, 160, 16)
for layer in range(L):
    row = e["phy2log"][layer * P:(layer + 1) * P]
    cnt = e["logcnt"][layer * E:(layer + 1) * E]
    assert all(0 <= x < E for x in row) and sum(cnt) == P and min(cnt) >= 1
    for r in range(R):  # eldr: never two replicas of one expert on a rank
        ranks = row[r * P // R:(r + 1) * P // R]
        assert len(set(ranks)) == len(ranks)
assert e["balancedness"] >= d["balancedness"], (e["balancedness"], d["balancedness"])
PYEOF
[ $? -eq 0 ] && ok "place: invariants, eldr at least as balanced as hierarchical EPLB" || bad "place invariants"
# The profile's gate_scores member is a second load (mean gate probability per expert); hand-checked below: its
# layer 1 differs from token_scores' layer 1, so the two placements' replica counts differ.
run_ok "place on gate_scores" "$ELDR" place profile --load "$PROFILE" --dataset gate_scores -P 160 -R 16 -N 2 -G 8 --json
$PY - "$PROFILE" "$WORK/place_eldr.json" "$WORK/out.txt" <<'PYEOF'
import json, sys
prof, tok, gate = (json.load(open(p)) for p in sys.argv[1:4])
E = gate["num_experts"]
g1 = prof["gate_scores"]["1"]
hot = max(range(E), key=lambda e: g1[str(e)])
assert gate["logcnt"][hot] >= 2, "the hottest gate_scores expert of layer 1 is replicated"
assert gate["logcnt"] != tok["logcnt"], "a placement of gate_scores, not of token_scores"
PYEOF
[ $? -eq 0 ] && ok "place --dataset gate_scores reads that member" || bad "place --dataset gate_scores"
expect_error "place: unknown JSON member" 'has the members "token_scores" and "gate_scores", not "/load"' - \
  "$ELDR" place profile --load "$PROFILE" --dataset /load -P 160 -R 16
run_ok "place with --previous: no moves for the same load" "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 -N 2 -G 8 --previous place_eldr.json --json
$PY -c "import json; assert json.load(open('$WORK/out.txt'))['moved_experts'] == 0" && ok "zero moves" || bad "zero moves"
run_ok "place per cluster into a calibration" "$ELDR" place calib --calib calib.h5 --out placed.h5 -P 80 -R 8 --json
$PY - "$WORK/placed.h5" <<'PYEOF'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
K = f["/clusters"].attrs["K"]
assert sorted(f["/placement"].keys()) == sorted([f"cluster_{k}" for k in range(K)] + ["global"])
assert f["/placement"].attrs["algorithm"] == "eldr" and f["/placement"].attrs["num_ranks"] == 8
for g in f["/placement"].values():
    p2l, cnt = g["phy2log"][:], g["logcnt"][:]
    assert p2l.shape == (26, 80) and cnt.shape == (26, 64) and (cnt >= 1).all() and (cnt.sum(axis=1) == 80).all()
    for layer in p2l:
        for r in range(8):
            slots = layer[r * 10:(r + 1) * 10]
            assert len(set(slots)) == len(slots)  # no expert twice on a rank
    assert 0 < g.attrs["balancedness"] <= 1
PYEOF
[ $? -eq 0 ] && ok "per-cluster placements under /placement (h5py)" || bad "per-cluster placements under /placement"
run_ok "a placed calibration still loads" "$ELDR" inspect placed.h5
expect_error "place: slots not divisible by ranks" "P = 150 must be a multiple of ranks R = 16" - "$ELDR" place profile --load "$PROFILE" -P 150 -R 16
expect_error "place: missing load file" "nope.json" - "$ELDR" place profile --load nope.json -P 160 -R 16
# The bounds of one EP group (-R 1024, -P 32768) and options that only a re-plan reads.
expect_error "place: -R above its bound" "--ranks: must be an integer in \[1, 1024\], got '2048'" - \
  "$ELDR" place profile --load "$PROFILE" -P 4096 -R 2048
expect_error "place: -P above its bound" "--slots: must be an integer in \[1, 32768\], got '65536'" - \
  "$ELDR" place profile --load "$PROFILE" -P 65536 -R 16
for opt in "--move-slack 0.1" "--expert-bytes 1000"; do
  expect_error "place: $opt without --previous" "${opt% *} applies to a re-plan only: give --previous" - \
    "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 $opt
done
expect_error "place: --move-slack with deepseek-global" "--move-slack does not apply to deepseek-global" - \
  "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 -N 2 -G 8 --algorithm deepseek-global \
  --previous place_eldr.json --move-slack 0.1
run_ok "place: --expert-bytes with --previous" "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 -N 2 -G 8 \
  --algorithm deepseek-global --previous place_eldr.json --expert-bytes 1000 --json
$PY -c "import json; j = json.load(open('$WORK/out.txt')); assert j['moved_bytes'] == 1000 * j['moved_experts'] > 0" \
  && ok "place: moved bytes = moved experts x --expert-bytes" || bad "place: moved bytes" "$(head -c 300 "$WORK/out.txt")"
# eldr's [E, R] tables for E = 16384 experts on R = 1024 ranks take 84 MB a thread: over a 16 MB budget, one line
# before anything is allocated.
$PY -c "
import h5py, numpy as np
with h5py.File('wide_load.h5', 'w') as f: f['/load'] = np.ones((1, 16384))
"
# A JSON load profile's text and DOM are checked before it is read (17 bytes per byte of the file: 140 MB here).
$PY -c "
import json
json.dump({'token_scores': {str(l): {str(e): 0.5 for e in range(64)} for l in range(12000)}}, open('big_prof.json', 'w'))
"
ELDR_MEMORY_BUDGET=64M expect_error "place: a JSON load larger than the memory allows" \
  "big_prof.json: parsing this JSON load profile: needs [0-9.]+ MB, this machine has 67.1 MB available \(as ELDR_MEMORY_BUDGET says\)" \
  - "$ELDR" place profile --load big_prof.json -P 64 -R 2
run_ok "place: the same JSON load within the memory" "$ELDR" place profile --load big_prof.json -P 64 -R 2
rm -f big_prof.json
ELDR_MEMORY_BUDGET=16M expect_error "place: memory checked before placing" \
  "wide_load.h5: eldr placement of L = 1 layers x E = 16384 experts into P = 16384 slots on R = 1024 ranks: needs [0-9.]+ MB, this machine has 16.8 MB available" \
  - "$ELDR" place profile --load wide_load.h5 -P 16384 -R 1024

# ---- the files as h5py and h5dump see them (names, types, shapes of DESIGN.md §5) ----
if $PY - "$WORK" <<'PYEOF'
import sys, h5py, numpy as np, json
w = sys.argv[1]
t = h5py.File(f"{w}/real.h5", "r")
assert t.attrs["num_layers"] == 26 and t.attrs["num_experts"] == 64 and t.attrs["top_k"] == 6
ids = t["/tokens/topk_ids"]
assert ids.dtype == np.uint16 and ids.shape[1:] == (26, 6), (ids.dtype, ids.shape)
assert ids.chunks is not None and ids.compression == "gzip"
assert t["/tokens/topk_weights"].dtype == np.float32 and t["/tokens/topk_weights"].shape == ids.shape
for name in ("id", "domain", "prompt_len", "num_tokens", "offset"):
    assert t["/requests/" + name].shape == (108,), name
assert t["/requests/offset"][-1] + t["/requests/num_tokens"][-1] == ids.shape[0]
# The first request's first token matches the JSONL line.
import gzip
import os
first = json.loads(gzip.open(os.environ["ELDR_SRC"] + "/tests/data/esft-deepseek-v2-lite/routing.jsonl.gz").readline())
assert t["/requests/id"][0].decode() == first["id"]
assert (ids[0] == np.array(first["topk_ids"][0])).all()
c = h5py.File(f"{w}/calib.h5", "r")
assert c.attrs["format"] == "eldr-calibration" and c.attrs["format_version"] == 1
for a in ("model", "num_layers", "num_experts", "top_k", "created"):
    assert a in c.attrs, a
L, E = 26, 64
assert c["/signature/idf"].shape == (L, E) and c["/signature/idf"].dtype == np.float32
mask = c["/signature/layer_mask"][:]
assert mask.shape == (L,) and c["/signature"].attrs["variant"] == "count_idf"
assert c["/signature/layer_order"].shape == (L,) and c["/signature/rho_curve"].shape == (L,)
D = int(mask.sum()) * E
N = c["/calibration/signatures"].shape[0]
assert c["/calibration/signatures"].shape == (N, D)
assert c["/calibration/request_ids"].shape == (N,) and c["/calibration/domains"].shape == (N,)
K = c["/clusters"].attrs["K"]
assert K == 4 and abs(c["/clusters"].attrs["tau"] - 0.1) < 1e-12
assert c["/clusters/centroids"].shape == (K, D) and c["/clusters/assignment"].shape == (N,)
assert c["/clusters/sizes"].shape == (K,) and c["/clusters/expert_load"].shape == (K, L, E)
# Balanced by decode work (the default): each cluster's Σ max(decode_len, 1) within ⌈Σ/K⌉ + the largest one.
assert c["/clusters"].attrs["balanced"] == 1 and c["/clusters"].attrs["work_balanced"] == 1
assert c["/clusters/sizes"][:].sum() == N and (np.bincount(c["/clusters/assignment"][:], minlength=K) == c["/clusters/sizes"][:]).all()
wl = np.maximum(c["/calibration/decode_lens"][:], 1)
assert all(wl[c["/clusters/assignment"][:] == q].sum() <= -(-wl.sum() // K) + wl.max() for q in range(K))
sig = c["/calibration/signatures"][:]
assert np.allclose(np.linalg.norm(sig, axis=1), 1, atol=1e-4)
# IDF by the definition, recomputed independently from the trace for the calibration requests.
ids_all = t["/tokens/topk_ids"][:]
rid = [x.decode() for x in t["/requests/id"][:]]
cal = set(x.decode() for x in c["/calibration/request_ids"][:])
off, pl = t["/requests/offset"][:], t["/requests/prompt_len"][:]
df = np.zeros((L, E))
for i, r in enumerate(rid):
    if r not in cal: continue
    seen = np.zeros((L, E), bool)
    for tok in ids_all[off[i]:off[i] + pl[i]]:
        for l in range(L): seen[l, tok[l]] = True
    df += seen
idf = np.log((len(cal) + 1) / (df + 1))
assert np.allclose(idf, c["/signature/idf"][:], atol=1e-5), "idf differs from the definition"
c2 = h5py.File(f"{w}/calib2.h5", "r")
assert c2["/clusters"].attrs["K"] == 2 and c2["/clusters/centroids"].shape == (2, D)
PYEOF
then ok "h5py reads trace and calibration with the documented schema; IDF matches the definition"; else bad "h5py schema check"; fi
if h5dump -H calib.h5 >"$WORK/dump.txt" 2>&1 && grep -q 'DATASET "centroids"' "$WORK/dump.txt" \
   && grep -q 'DATASET "expert_load"' "$WORK/dump.txt" && grep -q 'ATTRIBUTE "variant"' "$WORK/dump.txt"; then
  ok "h5dump reads calibration.h5"
else bad "h5dump reads calibration.h5" "$(head -5 "$WORK/dump.txt")"; fi
if h5dump -H real.h5 >"$WORK/dump.txt" 2>&1 && grep -q 'DATASET "topk_ids"' "$WORK/dump.txt" \
   && grep -q 'H5T_STD_U16LE' "$WORK/dump.txt"; then ok "h5dump reads the trace (uint16 topk_ids)"; else bad "h5dump reads the trace"; fi

# ---- bad input: one line, non-zero exit, no output file ----
expect_error "missing trace" "missing.h5: no such file" out.h5 "$ELDR" calibrate --trace missing.h5 -K 2 --out out.h5
head -c 5000 real.h5 > truncated.h5
expect_error "truncated trace" "truncated.h5" out.h5 "$ELDR" calibrate --trace truncated.h5 -K 2 --out out.h5
head -c 100000 real.h5 > truncated2.h5
expect_error "trace truncated after the header" "truncated2.h5" out.h5 "$ELDR" trace stats truncated2.h5
head -c 20000 /dev/urandom > corrupt.h5
expect_error "corrupt trace" "corrupt.h5: not an HDF5 file" out.h5 "$ELDR" calibrate --trace corrupt.h5 -K 2 --out out.h5
expect_error "corrupt calibration" "corrupt.h5" - "$ELDR" inspect corrupt.h5
head -c 3000 calib.h5 > cut_calib.h5
expect_error "truncated calibration" "cut_calib.h5" new.h5 "$ELDR" calibrate --refit cut_calib.h5 -K 2 --out new.h5
expect_error "trace given as calibration" "is a routing trace" - "$ELDR" inspect real.h5
expect_error "trace shape differs from the calibration" "syn.h5: model shape .* differs from calib.h5" - \
  "$ELDR" inspect calib.h5 --trace syn.h5
expect_error "route: trace shape differs from the calibration" "syn.h5: model shape .* differs from calib.h5" - \
  "$ELDR" route --calib calib.h5 --trace syn.h5
expect_error "route: unknown policy" "unknown routing policy 'fastest'" - "$ELDR" route --calib calib.h5 --trace real.h5 --policy fastest
expect_error "route: missing calibration" "nope.h5: no such file" - "$ELDR" route --calib nope.h5 --trace real.h5
expect_error "route: negative rate" "rate" - "$ELDR" route --calib calib.h5 --trace real.h5 --rate -3
expect_error "K < 1" "must be in \[1," out.h5 "$ELDR" calibrate --trace real.h5 -K 0 --out out.h5
expect_error "K > N" "K = 500 must be in \[1, 108\]" out.h5 "$ELDR" calibrate --trace real.h5 -K 500 --out out.h5
expect_error "refit K > N" "must be in \[1," out.h5 "$ELDR" calibrate --refit calib.h5 -K 1000 --out out.h5
expect_error "negative tau" "tau" out.h5 "$ELDR" calibrate --trace real.h5 -K 2 --tau -0.5 --out out.h5
expect_error "unwritable output path" "no/such/dir/out.h5: cannot write" no/such/dir/out.h5 \
  "$ELDR" calibrate --trace real.h5 -K 2 --out no/such/dir/out.h5
mkdir -p ro && chmod 555 ro
if [ "$(id -u)" != 0 ]; then
  expect_error "read-only output directory" "ro/out.h5: cannot write" ro/out.h5 "$ELDR" calibrate --trace real.h5 -K 2 --out ro/out.h5
fi
# NaN and negative values inside an HDF5 calibration (edited with h5py), and in a JSONL trace.
cp calib.h5 nan.h5 && $PY -c "import h5py,numpy as np; f=h5py.File('nan.h5','r+'); s=f['/calibration/signatures']; a=s[:]; a[0,0]=np.nan; s[...]=a"
expect_error "NaN in calibration signatures" "nan.h5: .*NaN" out.h5 "$ELDR" calibrate --refit nan.h5 -K 2 --out out.h5
cp calib.h5 neg.h5 && $PY -c "import h5py; f=h5py.File('neg.h5','r+'); d=f['/signature/idf']; a=d[:]; a[0,0]=-1; d[...]=a"
expect_error "negative IDF in calibration" "neg.h5: .*negative" - "$ELDR" inspect neg.h5
# expert_load is a per-token activation probability: -5 or 1e38 was accepted and routed on (route priced with it).
for v in -5 1e38; do
  cp calib.h5 load.h5 && $PY -c "import h5py; f=h5py.File('load.h5','r+'); d=f['/clusters/expert_load']; a=d[:]; a[0,0,0]=$v; d[...]=a"
  expect_error "expert_load $v in calibration" "load.h5: /clusters/expert_load has values outside \[0, 1\]" - \
    "$ELDR" route --calib load.h5 --trace real.h5
done
cp real.h5 negw.h5 && $PY -c "import h5py; f=h5py.File('negw.h5','r+'); d=f['/tokens/topk_weights']; a=d[0:1]; a[0,0,0]=-2; d[0:1]=a"
# calibrate reads the gate weights only for gate_prob signatures (the other variants never use them).
expect_error "negative weight in HDF5 trace" "negw.h5: .*negative" out.h5 "$ELDR" calibrate --trace negw.h5 -K 2 \
  --signature gate_prob --out out.h5
line='{"id":"a","domain":"x","num_layers":1,"num_experts":4,"top_k":2,"num_tokens":2,"prompt_len":1,"topk_ids":[[[0,1]],[[2,3]]]}'
printf '%s\n%s\n' "$line" "${line/\"a\"/\"b\"}" > good.jsonl
run_ok "import a hand-written JSONL" "$ELDR" trace import --in good.jsonl --out good.h5
printf '%s\n%s\n' "$line" "${line/\[\[0,1\]\]/[[0,NaN]]}" | sed '2s/"a"/"b"/' > nan.jsonl
expect_error "NaN in a JSONL line" "nan.jsonl:2: not valid JSON" out.h5 "$ELDR" trace import --in nan.jsonl --out out.h5
printf '%s\n%s\n' "$line" "${line/\"x\"/\"\"}" | sed '2s/"a"/"b"/' > emptydom.jsonl
expect_error "empty domain label" "emptydom.jsonl:2: field 'domain' is an empty string" out.h5 "$ELDR" trace import --in emptydom.jsonl --out out.h5
# HDF5 strings end at a NUL: "a\u0000b" and "a\u0000c" were stored as two requests "a", which every reader refuses.
printf '%s\n%s\n' "${line/\"a\"/\"a\\u0000b\"}" "${line/\"a\"/\"a\\u0000c\"}" > nulid.jsonl
expect_error "NUL in a JSONL id" "nulid.jsonl:1: field 'id' contains a NUL character" out.h5 \
  "$ELDR" trace import --in nulid.jsonl --out out.h5
printf '%s\n' "${line/\"x\"/\"x\\u0000y\"}" > nuldom.jsonl
expect_error "NUL in a JSONL domain" "nuldom.jsonl:1: field 'domain' contains a NUL character" out.h5 \
  "$ELDR" trace import --in nuldom.jsonl --out out.h5
# A key twice in one JSON object was read as its last value (another id, another domain): refused, as in YAML.
printf '%s\n' "${line/\"domain\":\"x\"/\"domain\":\"x\",\"domain\":\"y\"}" > dupkey.jsonl
expect_error "duplicate key in a JSONL line" "dupkey.jsonl:1: duplicate key \"domain\" in a JSON object" out.h5 \
  "$ELDR" trace import --in dupkey.jsonl --out out.h5
# A field the format does not have was ignored: a misspelt optional field ("domian") imported the request without
# its label, and a misspelt "topk_id" was reported as a missing topk_ids. Refused, naming the line, the field, the
# nearest real field and every accepted one; a line with every optional field still imports.
fields="id, domain, model, num_layers, num_experts, top_k, num_tokens, prompt_len, topk_ids, topk_weights"
printf '%s\n%s\n' "$line" "${line/\"domain\"/\"domian\"}" | sed '2s/"a"/"b"/' > typodom.jsonl
expect_error "unknown JSONL field (domain misspelt)" \
  "error: typodom.jsonl:2: unknown field 'domian' \(did you mean 'domain'\?\); a record's fields are $fields \(DESIGN.md §5\)$" \
  out.h5 "$ELDR" trace import --in typodom.jsonl --out out.h5
printf '%s\n' "${line/\"topk_ids\"/\"topk_id\"}" > typoids.jsonl
expect_error "unknown JSONL field (topk_ids misspelt)" "error: typoids.jsonl:1: unknown field 'topk_id' \(did you mean 'topk_ids'\?\)" \
  out.h5 "$ELDR" trace import --in typoids.jsonl --out out.h5
printf '%s\n' "${line/\"domain\"/\"source\":\"vllm\",\"domain\"}" > extra.jsonl
expect_error "unknown JSONL field (no near name)" "error: extra.jsonl:1: unknown field 'source'; a record's fields are $fields" \
  out.h5 "$ELDR" trace import --in extra.jsonl --out out.h5
printf '%s\n' "${line/\"domain\"/\"model\":\"m\",\"topk_weights\":[[[0.5,0.5]],[[0.75,0.25]]],\"domain\"}" > allfields.jsonl
run_ok "a JSONL line with every optional field imports" "$ELDR" trace import --in allfields.jsonl --out allfields.h5
# The model name: a second one was dropped silently (the file keeps the first), a number was ignored.
printf '%s\n%s\n' "${line/\"domain\"/\"model\":\"m1\",\"domain\"}" "${line/\"domain\"/\"model\":\"m2\",\"domain\"}" \
  | sed '2s/"a"/"b"/' > twomodels.jsonl
expect_error "two model names in one JSONL" "twomodels.jsonl:2: model 'm2' differs from the first request's 'm1'" out.h5 \
  "$ELDR" trace import --in twomodels.jsonl --out out.h5
printf '%s\n' "${line/\"domain\"/\"model\":5,\"domain\"}" > nummodel.jsonl
expect_error "a numeric model name in JSONL" "nummodel.jsonl:1: field 'model' must be a string" out.h5 \
  "$ELDR" trace import --in nummodel.jsonl --out out.h5
printf '%s\n%s\n' "$line" "${line/\[\[2,3\]\]/[[2,9]]}" | sed '2s/"a"/"b"/' > badid.jsonl
expect_error "expert id >= num_experts" "badid.jsonl:2: .*expert id 9" out.h5 "$ELDR" trace import --in badid.jsonl --out out.h5
expect_error "missing JSONL" "nothere.jsonl: no such file" out.h5 "$ELDR" trace import --in nothere.jsonl --out out.h5
head -c 3000000 "$SRC/tests/data/esft-deepseek-v2-lite/routing.jsonl.gz" > cut.jsonl.gz
expect_error "truncated gzip JSONL" "cut.jsonl.gz" out.h5 "$ELDR" trace import --in cut.jsonl.gz --out out.h5
expect_error "synth with zero domains" "domain" out.h5 "$ELDR" trace synth --domains 0 --out out.h5
expect_error "synth with bad range" "--prompt-len" out.h5 "$ELDR" trace synth --prompt-len 9:3 --out out.h5
# trace synth --like: a generator fitted to the real trace; the output is a trace h5py reads, of new requests.
run_ok "synth --like the real trace" "$ELDR" trace synth --like real.h5 --requests 40 --seed 3 --separation 2 --out like.h5
grep -q "novelty .*: novel$" "$WORK/out.txt" && ok "synth --like reports its requests novel" || bad "synth --like novelty line"
$PY - "$WORK/like.h5" "$WORK/real.h5" <<'PYEOF'
import sys, h5py, numpy as np
g, r = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
for a in ("num_layers", "num_experts", "top_k"):
    assert g.attrs[a] == r.attrs[a], a
ids, n = g["/tokens/topk_ids"], len(g["/requests/id"])
assert n == 40 and ids.dtype == np.uint16 and ids.shape[1:] == (26, 6), (n, ids.dtype, ids.shape)
assert g["/tokens/topk_weights"].shape == ids.shape
nt, off, pl = g["/requests/num_tokens"][:], g["/requests/offset"][:], g["/requests/prompt_len"][:]
assert nt.sum() == ids.shape[0] and (off == np.concatenate([[0], np.cumsum(nt)[:-1]])).all()
assert ((pl >= 1) & (pl < nt)).all()
t = ids[:]
assert t.max() < 64 and all(len(set(row)) == 6 for row in t.reshape(-1, 6)[:5000])
real_domains = set(x.decode() if isinstance(x, bytes) else x for x in r["/requests/domain"][:])
assert set(x.decode() if isinstance(x, bytes) else x for x in g["/requests/domain"][:]) <= real_domains
PYEOF
[ $? -eq 0 ] && ok "h5py reads the --like trace: shape, offsets, distinct top-k, real domains" || bad "h5py reads the --like trace"
cp real.h5 prompt_only.h5 && $PY -c "
import h5py; f = h5py.File('prompt_only.h5', 'r+'); f['/requests/prompt_len'][...] = f['/requests/num_tokens'][:]"
expect_error "synth --like a trace without decode tokens" "prompt_only.h5: .*--like trace has no decode tokens" out.h5 \
  "$ELDR" trace synth --like prompt_only.h5 --out out.h5
expect_error "calibrate a trace without decode tokens" "prompt_only.h5: none of the trace's 108 requests has both prompt and decode tokens" \
  out.h5 "$ELDR" calibrate --trace prompt_only.h5 -K 2 --out out.h5
expect_error "synth --like --requests 0" "--requests: must be an integer in \[1, [0-9]+\], got '0'" out.h5 "$ELDR" trace synth --like real.h5 --requests 0 --out out.h5
expect_error "synth --like with a domain count unlike the trace's" "--domains 3 does not match the 4 domains" out.h5 \
  "$ELDR" trace synth --like real.h5 --domains 3 --out out.h5
expect_error "synth --like negative separation" "--separation: must be in \[0, 100\], got '-1'" out.h5 \
  "$ELDR" trace synth --like real.h5 --separation -1 --out out.h5
expect_error "synth --like missing trace" "nope.h5: no such file" out.h5 "$ELDR" trace synth --like nope.h5 --out out.h5
expect_error "gate_prob without weights" "gate_prob" out.h5 "$ELDR" calibrate --trace good.h5 -K 1 --signature gate_prob --out out.h5
# Inputs found by review: each must be one clear error, never a crash or a silent success.
printf '{"id":"a","num_layers":2305843009213693953,"num_experts":8,"top_k":4,"num_tokens":1,"prompt_len":1,"topk_ids":[[]]}\n' > huge.jsonl
expect_error "absurd num_layers" "huge.jsonl:1: num_layers .* must be in \[1, 4096\]" out.h5 "$ELDR" trace import --in huge.jsonl --out out.h5
$PY - "$SRC" <<'PYEOF'
import gzip, zlib, sys
lines = gzip.open(sys.argv[1] + "/tests/data/esft-deepseek-v2-lite/routing.jsonl.gz").read().split(b"\n")
c = zlib.compressobj(9, zlib.DEFLATED, 31)
data = c.compress(b"\n".join(lines[:5]) + b"\n") + c.flush(zlib.Z_FULL_FLUSH)  # cut at a flush point: no trailer
open("flushcut.jsonl.gz", "wb").write(data)
PYEOF
expect_error "gzip cut at a flush point" "flushcut.jsonl.gz.*(read error|truncated)" out.h5 "$ELDR" trace import --in flushcut.jsonl.gz --out out.h5
cp calib.h5 nstar.h5 && $PY -c "import h5py; f=h5py.File('nstar.h5','r+'); f['/signature'].attrs['n_star']=100000000"
expect_error "n_star out of range" "nstar.h5: .*n_star" - "$ELDR" inspect nstar.h5
cp calib.h5 order.h5 && $PY -c "
import h5py, numpy as np
f = h5py.File('order.h5', 'r+'); del f['/signature/layer_order']; f['/signature/layer_order'] = np.zeros(0, np.int32)"
expect_error "layer_order not a permutation" "order.h5: .*layer_order" o.h5 "$ELDR" calibrate --refit order.h5 -K 2 --out o.h5
cp real.h5 negid.h5 && $PY -c "
import h5py, numpy as np
f = h5py.File('negid.h5', 'r+'); a = f['/tokens/topk_ids'][:].astype(np.int32); a[0, 0, 0] = -1
del f['/tokens/topk_ids']; f['/tokens/topk_ids'] = a"
expect_error "negative expert id stored as int32" "negid.h5: .*topk_ids" out.h5 "$ELDR" calibrate --trace negid.h5 -K 2 --out out.h5
# A trace of another format version is refused by every reader (it was read as version 1).
cp good.h5 v2.h5 && $PY -c "import h5py; h5py.File('v2.h5', 'r+').attrs['format_version'] = 2"
expect_error "trace format_version 2 (stats)" "v2.h5: trace format_version 2 is not supported" - "$ELDR" trace stats v2.h5
expect_error "trace format_version 2 (calibrate)" "v2.h5: trace format_version 2 is not supported" out.h5 \
  "$ELDR" calibrate --trace v2.h5 -K 1 --out out.h5
# An empty request id in an HDF5 trace is refused, as the JSONL import refuses it (it was accepted).
cp good.h5 emptyid.h5 && $PY -c "
import h5py; f = h5py.File('emptyid.h5', 'r+'); ids = f['/requests/id'][:]; ids[0] = b''; f['/requests/id'][:] = ids"
expect_error "trace with an empty request id" "emptyid.h5: request 0 .*: empty request id" - \
  "$ELDR" trace stats emptyid.h5
expect_error "unwritable --report: no calibration either" "no/dir/r.json: cannot write" c9.h5 \
  "$ELDR" calibrate --trace real.h5 -K 2 --out c9.h5 --report no/dir/r.json
run_ok "calibrate with tau 0.3" "$ELDR" calibrate --trace real.h5 -K 4 --tau 0.3 --out tau.h5
run_ok "refit keeps the stored tau" "$ELDR" calibrate --refit tau.h5 -K 2 --out tau2.h5
$PY -c "import h5py; assert abs(h5py.File('tau2.h5','r')['/clusters'].attrs['tau'] - 0.3) < 1e-12" \
  && ok "refit kept tau = 0.3" || bad "refit kept tau = 0.3"
# Cluster balance: work by default (Σ decode tokens per cluster), count on request, and --refit keeps the stored
# one. h5py reads the attributes; the work bound (⌈Σw/K⌉ + max w) is recomputed from the stored decode_lens.
run_ok "calibrate --balance count" "$ELDR" calibrate --trace real.h5 -K 4 --balance count --out count.h5
run_ok "refit keeps the stored balance (count)" "$ELDR" calibrate --refit count.h5 -K 2 --out count2.h5
run_ok "refit keeps the stored balance (none)" "$ELDR" calibrate --refit syn_calib.h5 -K 2 --out none2.h5
run_ok "refit --balance work" "$ELDR" calibrate --refit count.h5 -K 2 --balance work --out work2.h5
$PY -c "
import h5py, numpy as np
def balance(p):
    a = h5py.File(p, 'r')['/clusters'].attrs
    return 'none' if not a['balanced'] else 'work' if a.get('work_balanced', 0) else 'count'
files = ('calib.h5', 'calib2.h5', 'count.h5', 'count2.h5', 'work2.h5', 'syn_calib.h5', 'none2.h5')
got = [balance(p) for p in files]
assert got == ['work', 'work', 'count', 'count', 'work', 'none', 'none'], list(zip(files, got))
assert sorted(h5py.File('count.h5', 'r')['/clusters/sizes'][:]) == [27, 27, 27, 27]
def work(p):
    f = h5py.File(p, 'r'); w = np.maximum(f['/calibration/decode_lens'][:], 1); a = f['/clusters/assignment'][:]
    K = int(f['/clusters'].attrs['K'])
    return max(w[a == k].sum() for k in range(K)), -(-w.sum() // K) + w.max()
for p in ('calib.h5', 'calib2.h5', 'work2.h5'):
    assert work(p)[0] <= work(p)[1], (p, work(p))
assert work('count.h5')[0] > work('count.h5')[1], work('count.h5')  # by count the long domains break it
" && ok "balance attributes and the work bound" || bad "balance attributes and the work bound"
cp count.h5 badbal.h5 && $PY -c "
import h5py; a = h5py.File('badbal.h5', 'r+')['/clusters'].attrs; a['balanced'] = 0; a['work_balanced'] = 1"
expect_error "balanced = 0 with work_balanced = 1" "badbal.h5: /clusters has balanced = 0 but work_balanced = 1" \
  out.h5 "$ELDR" calibrate --refit badbal.h5 -K 2 --out out.h5
cp calib.h5 nolens.h5 && $PY -c "
import h5py; f = h5py.File('nolens.h5', 'r+'); del f['/calibration/decode_lens']; del f['/clusters/mean_decode_len']"
expect_error "work_balanced = 1 with its decode lengths removed (not read as count)" \
  "nolens.h5: /clusters has work_balanced = 1 but no /calibration/decode_lens; re-run eldr calibrate" \
  out.h5 "$ELDR" calibrate --refit nolens.h5 -K 2 --out out.h5
expect_error "empty --balance" "--balance: cluster balance '' must be work, count or none" b.h5 \
  "$ELDR" calibrate --trace real.h5 -K 2 --balance "" --out b.h5
expect_error "unknown --balance" "--balance: cluster balance 'tokens' must be work, count or none" b.h5 \
  "$ELDR" calibrate --trace real.h5 -K 2 --balance tokens --out b.h5
run_ok "route with a tight admission cap (requests wait at the router)" "$ELDR" route --calib calib.h5 --trace real.h5 --cap 2 --rate 0 --json
$PY -c "
import json; j = json.load(open('$WORK/out.txt'))
for p in j['policies']:
    assert sum(d['requests'] for d in p['decoders']) == 108, p['policy']
    assert p['max_in_flight'] <= 2 * j['num_decoders'], (p['policy'], p['max_in_flight'])
" && ok "cap respected, every request routed" || bad "cap respected, every request routed"
expect_error "absurd batch size" "--batch-sizes: must be an integer in \\[1, 65536\\], got '100000000'" - "$ELDR" trace stats real.h5 --batch-sizes 100000000

# ---- eldr place evaluate: held-out decode steps through contiguous, global and per-cluster placements ----
"$ELDR" place --help | grep -q "evaluate" && "$ELDR" place evaluate --help | grep -q -- "--holdout-from-calib" \
  && ok "place --help lists evaluate, whose --help documents --holdout-from-calib" || bad "place --help lists evaluate"
run_ok "place --evaluate: stored placements, held-out requests" "$ELDR" place evaluate --trace real.h5 --calib placed.h5 \
  --holdout-from-calib --json --out eval.json
# An independent numpy replay: nearest centroid of the count-idf signature over the layer mask, round-robin
# steps of 16 tokens (a shorter last step dropped), rank loads with replicas sharing evenly, DESIGN.md §3.
$PY - "$WORK" <<'PYEOF'
import sys, json, h5py, numpy as np
w = sys.argv[1]
j = json.load(open(f"{w}/eval.json"))
assert j == json.load(open(f"{w}/out.txt")), "--json output and --out file differ"
t, c = h5py.File(f"{w}/real.h5", "r"), h5py.File(f"{w}/placed.h5", "r")
ids = t["/tokens/topk_ids"][:].astype(np.int64)
L, E, k, R, B = 26, 64, 6, 8, 16
rid = [x.decode() for x in t["/requests/id"][:]]
off, pl, nt = t["/requests/offset"][:], t["/requests/prompt_len"][:], t["/requests/num_tokens"][:]
members = set(x.decode() for x in c["/calibration/request_ids"][:])
held = [i for i in range(len(rid)) if rid[i] not in members and pl[i] > 0 and nt[i] > pl[i]]
report = json.load(open(f"{w}/report.json"))
assert j["num_requests"] == len(held) == report["num_holdout"], (j["num_requests"], len(held))
assert j["num_calibration_members"] == 0 and j["num_members_left_out"] == len(members)
assert j["num_ranks"] == R and j["num_slots"] == 80 and j["batch_size"] == B and "placed.h5 /placement" in j["placements"]
assert abs(j["balanced_max_rank_load"] - B * k / R) < 1e-12
assert c["/signature"].attrs["variant"] == "count_idf"
idf, mask, cent = c["/signature/idf"][:], c["/signature/layer_mask"][:].astype(bool), c["/clusters/centroids"][:]
def cluster_of(i):
    cnt = np.zeros((L, E))
    for l in range(L):
        np.add.at(cnt[l], ids[off[i]:off[i] + pl[i], l, :].ravel(), 1)
    x = (cnt * idf)[mask].ravel()
    d = cent @ (x / np.linalg.norm(x))
    s = np.sort(d)
    assert s[-1] - s[-2] > 1e-5, "near tie between centroids"
    return int(np.argmax(d))
def placement(g):
    p2l = c[g + "/phy2log"][:]
    cnt = np.zeros((L, E))
    for l in range(L): np.add.at(cnt[l], p2l[l], 1)
    return p2l, cnt
contiguous = (np.tile(np.arange(E), (L, 1)), np.ones((L, E)))
glob = placement("/placement/global")
def step_stats(step, plc):
    p2l, cnt = plc
    load = np.zeros((L, E))
    for l in range(L): np.add.at(load[l], ids[step, l, :].ravel(), 1)
    share = np.take_along_axis(load / cnt, p2l, axis=1)           # [L, P] load of each slot
    ranks = share.reshape(L, R, -1).sum(axis=2)                    # [L, R]
    return ranks.mean(axis=1).sum() / ranks.max(axis=1).sum(), ranks.max(axis=1).mean()
def close(a, b): return abs(a - b) <= 1e-9 * max(1, abs(b))
pooled = {"contiguous": [], "global": [], "per_cluster": []}
K = c["/clusters"].attrs["K"]
assign = {i: cluster_of(i) for i in held}
for kk in range(K):
    reqs = [i for i in held if assign[i] == kk]
    stream = []
    for tt in range(max([nt[i] - pl[i] for i in reqs], default=0)):
        stream += [off[i] + pl[i] + tt for i in reqs if tt < nt[i] - pl[i]]
    steps = [stream[s:s + B] for s in range(0, len(stream), B)]
    if len(steps) > 1 and len(steps[-1]) < B: steps.pop()
    got = j["clusters"][kk]
    assert got["cluster"] == kk and got["requests"] == len(reqs) and got["steps"] == len(steps), (kk, got)
    if not steps:  # a cluster no held-out request is nearest to: no steps, no figures
        assert all(got[name]["mean_balancedness"] is None for name in pooled), (kk, got)
        continue
    for name, plc in (("contiguous", contiguous), ("global", glob), ("per_cluster", placement(f"/placement/cluster_{kk}"))):
        v = [step_stats(np.array(s), plc) for s in steps]
        pooled[name] += v
        b = [x[0] for x in v]
        assert close(got[name]["mean_balancedness"], np.mean(b)), (kk, name, got[name], np.mean(b))
        assert close(got[name]["p1_balancedness"], np.percentile(b, 1)), (kk, name)
        assert close(got[name]["mean_max_rank_load"], np.mean([x[1] for x in v])), (kk, name)
        assert 0 < min(b) and max(b) <= 1 + 1e-12
for name, v in pooled.items():
    got = j["overall"][name]
    assert close(got["mean_balancedness"], np.mean([x[0] for x in v])), name
    assert close(got["p1_balancedness"], np.percentile([x[0] for x in v], 1)), name
    assert close(got["mean_max_rank_load"], np.mean([x[1] for x in v])), name
assert j["overall"]["steps"] == len(pooled["contiguous"]) > 0
PYEOF
[ $? -eq 0 ] && ok "place evaluate equals an independent numpy replay (held-out set, clusters, steps, rank loads)" \
  || bad "place evaluate equals an independent numpy replay"
run_ok "place --evaluate: table" "$ELDR" place evaluate --trace real.h5 --calib placed.h5 --holdout-from-calib
grep -qE "^all +[0-9]+ +[0-9]+ +contiguous" "$WORK/out.txt" && grep -q "per-cluster" "$WORK/out.txt" && grep -q "^# " "$WORK/out.txt" \
  && ok "place evaluate prints a header and a table" || bad "place evaluate prints a header and a table" "$(head -3 "$WORK/out.txt")"
run_ok "place --evaluate: R = 16 placed now, every request" "$ELDR" place evaluate --trace real.h5 --calib placed.h5 -R 16 -P 80 --json
$PY -c "
import json; j = json.load(open('$WORK/out.txt'))
assert j['num_ranks'] == 16 and j['placements'].startswith('placed now with eldr'), j['placements']
assert j['num_requests'] == 108 and j['num_calibration_members'] == 86 and j['requests'] == 'all'
assert sum(c['requests'] for c in j['clusters']) == 108
for b in j['overall'].values():
    if isinstance(b, dict): assert 0 < b['p1_balancedness'] <= b['mean_balancedness'] <= 1 and b['mean_max_rank_load'] >= 6
" && ok "R = 16: placed now, all requests counted, members flagged" || bad "R = 16: placed now, all requests counted"
run_ok "place --evaluate: no /placement, ranks given" "$ELDR" place evaluate --trace real.h5 --calib calib.h5 -R 8 --batch 8
head -c 20000 /dev/urandom > ecorrupt.h5
expect_error "evaluate: trace of another model shape" "syn.h5: model shape .* differs from placed.h5" ev.json \
  "$ELDR" place evaluate --trace syn.h5 --calib placed.h5 --out ev.json
expect_error "evaluate: ranks do not divide the experts" "E = 64 to be a multiple of ranks R = 12" ev.json \
  "$ELDR" place evaluate --trace real.h5 --calib placed.h5 -R 12 -P 84 --out ev.json
expect_error "evaluate: missing trace" "nope.h5: no such file" ev.json \
  "$ELDR" place evaluate --trace nope.h5 --calib placed.h5 --out ev.json
expect_error "evaluate: corrupt calibration" "ecorrupt.h5: not an HDF5 file" ev.json \
  "$ELDR" place evaluate --trace real.h5 --calib ecorrupt.h5 --out ev.json
expect_error "evaluate: truncated trace" "truncated.h5" ev.json \
  "$ELDR" place evaluate --trace truncated.h5 --calib placed.h5 --out ev.json
expect_error "evaluate: no /placement and no --ranks" "calib.h5 has no /placement" ev.json \
  "$ELDR" place evaluate --trace real.h5 --calib calib.h5 --out ev.json
expect_error "evaluate: nothing held out" "real.h5: no held-out request" ev.json \
  "$ELDR" place evaluate --trace real.h5 --calib tau.h5 -R 8 --holdout-from-calib --out ev.json
# /placement's node count out of range: 2^32 + 1 was read as 1 node; -4 was reported as a bad rank or slot count.
for nodes in 4294967297 -4 3; do  # 3 nodes cannot hold R = 8 ranks equally
  cp placed.h5 nodes.h5 && $PY -c "import h5py; h5py.File('nodes.h5', 'r+')['/placement'].attrs['num_nodes'] = $nodes"
  expect_error "evaluate: /placement num_nodes = $nodes" "nodes.h5: /placement has .*num_nodes = $nodes.*re-run eldr place calib" \
    ev.json "$ELDR" place evaluate --trace real.h5 --calib nodes.h5 --out ev.json
done
# A /placement that names no known algorithm, or holds a cluster group without its phy2log, is refused by every
# reader (inspect printed the name and exited 0; the group was taken for an absent one, falling back to global).
cp placed.h5 algo.h5 && $PY -c "import h5py; h5py.File('algo.h5', 'r+')['/placement'].attrs['algorithm'] = 'foo'"
expect_error "inspect: /placement algorithm 'foo'" "algo.h5: /placement has algorithm 'foo', not one of" - "$ELDR" inspect algo.h5
cp placed.h5 nophy.h5 && $PY -c "import h5py; del h5py.File('nophy.h5', 'r+')['/placement/cluster_1/phy2log']"
expect_error "evaluate: cluster_1 without phy2log" "nophy.h5: /placement/cluster_1 has no phy2log" ev.json \
  "$ELDR" place evaluate --trace real.h5 --calib nophy.h5 --out ev.json
# --previous: num_slots beside a phy2log of another width.
$PY -c "
import json
j = json.load(open('place_eldr.json')); j['num_slots'] = 96
json.dump(j, open('prev_slots.json', 'w'))
"
expect_error "place --previous: num_slots contradicts phy2log" "prev_slots.json: num_slots = 96 but phy2log holds 160 slots" - \
  "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 -N 2 -G 8 --previous prev_slots.json
# --previous: logcnt, log2phy or algorithm contradicting phy2log (were ignored).
$PY -c "
import json
j = json.load(open('place_eldr.json'))
a = dict(j); a['logcnt'] = [[1] * len(r) for r in j['logcnt']] if isinstance(j['logcnt'][0], list) else [1] * len(j['logcnt'])
json.dump(a, open('prev_logcnt.json', 'w'))
b = dict(j); b['log2phy'] = list(reversed(j['log2phy']))  # other experts' slots
json.dump(b, open('prev_log2phy.json', 'w'))
c = dict(j); c['algorithm'] = 'magic'
json.dump(c, open('prev_algo.json', 'w'))
"
for key in logcnt log2phy; do
  expect_error "place --previous: $key contradicts phy2log" "prev_$key.json: $key contradicts phy2log" - \
    "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 -N 2 -G 8 --previous "prev_$key.json"
done
# A DeepSeek placement lists an expert's replicas in eplb's order, not by slot: a re-plan from it is accepted.
for algo in deepseek-global deepseek-hierarchical; do
  "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 -N 2 -G 8 --algorithm $algo --json >"prev_$algo.json"
  run_ok "place --previous from $algo's output" "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 -N 2 -G 8 \
    --previous "prev_$algo.json" --json
done
expect_error "place --previous: an unknown algorithm" "prev_algo.json: algorithm = \"magic\" is not a placement algorithm" - \
  "$ELDR" place profile --load "$PROFILE" -P 160 -R 16 -N 2 -G 8 --previous prev_algo.json
# A missing required option or subcommand is CLI11's error (and its "Run with --help" line).
"$ELDR" place evaluate --calib placed.h5 >"$WORK/out.txt" 2>"$WORK/err.txt"
[ $? -ne 0 ] && grep -q -- "--trace is required" "$WORK/err.txt" && ok "evaluate: without --trace" \
  || bad "evaluate: without --trace" "$(cat "$WORK/err.txt")"
"$ELDR" place --load "$PROFILE" -P 160 -R 16 >"$WORK/out.txt" 2>"$WORK/err.txt"
[ $? -ne 0 ] && ok "place: the pre-0.2 flags without a subcommand are refused" || bad "place: pre-0.2 flags refused"
expect_error "evaluate: unwritable --out" "no/dir/ev.json: cannot write" no/dir/ev.json \
  "$ELDR" place evaluate --trace real.h5 --calib placed.h5 --out no/dir/ev.json
cp placed.h5 noclus.h5 && $PY -c "import h5py; f=h5py.File('noclus.h5','r+'); del f['/placement/cluster_2']"
run_ok "evaluate: /placement lacks a cluster (it uses global, as eldr serve does)" \
  "$ELDR" place evaluate --trace real.h5 --calib noclus.h5 --json
$PY -c "
import json; j = json.load(open('$WORK/out.txt'))
assert 'no cluster_k for cluster 2: global used' in j['placements'], j['placements']
c = j['clusters'][2]
assert c['steps'] == 0 or c['per_cluster'] == c['global'], c
" && ok "a missing cluster_k is replayed with the global placement" || bad "a missing cluster_k uses global"
cp placed.h5 noalgo.h5 && $PY -c "import h5py; f=h5py.File('noalgo.h5','r+'); del f['/placement'].attrs['algorithm']"
run_ok "evaluate: a /placement that does not record its algorithm" "$ELDR" place evaluate --trace real.h5 --calib noalgo.h5 --json
$PY -c "import json; j = json.load(open('$WORK/out.txt')); assert j['placements'].startswith('placed now with eldr'), j['placements']" \
  && ok "an unrecorded algorithm is placed now, not matched" || bad "an unrecorded algorithm is placed now"
"$ELDR" place profile --load "$PROFILE" -R 16 >"$WORK/out.txt" 2>"$WORK/err.txt"
[ $? -ne 0 ] && grep -q -- "--slots is required" "$WORK/err.txt" && ok "place profile without --slots" \
  || bad "place profile without --slots" "$(cat "$WORK/err.txt")"

# An existing output survives a failed run untouched.
cp calib.h5 keep.h5; before=$(md5sum < keep.h5)
expect_error "failed run keeps the old output" "must be in" - "$ELDR" calibrate --trace real.h5 -K 0 --out keep.h5
[ "$(md5sum < keep.h5)" = "$before" ] && ok "old output intact" || bad "old output intact"

finish
