#!/usr/bin/env python3
"""Checks eldr's predicted expert union (runtime/router/predicted_union.h) against real unions of a calibration's
own members: for each cluster k and batch size B, the mean number of distinct (layer, expert) pairs that one random
decode token from each of B random members touches, against Σ_ℓ,e (1 − (1 − q_k(ℓ,e))^B) with q_k the cluster's
/clusters/expert_load (all layers, no mask). A ratio far from 1 for a cluster would mean that pricing its requests
by the mean profile misjudges how they share experts.

  /usr/bin/python3 bench/union_check.py TRACE.h5 CALIBRATION.h5 [SAMPLES=200]

TRACE.h5 is the trace the calibration was fitted on (its requests are found by id).
"""
import sys

import h5py
import numpy as np


def text(values):
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    samples = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    rng = np.random.default_rng(0)
    tr, cb = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
    ids = tr["tokens/topk_ids"][()]  # [T, L, k]
    off, nt, pl = (tr[f"requests/{x}"][()] for x in ("offset", "num_tokens", "prompt_len"))
    dom, rid = text(tr["requests/domain"][()]), text(tr["requests/id"][()])
    row = {r: i for i, r in enumerate(rid)}
    members_of = {}
    for i, r in enumerate(text(cb["calibration/request_ids"][()])):
        m = row[r]
        if nt[m] > pl[m]:
            members_of.setdefault(int(cb["clusters/assignment"][i]), []).append(m)
    q = np.clip(cb["clusters/expert_load"][()].astype(np.float64), 0, 1 - 1e-6)  # [K, L, E]
    K, L, E = q.shape
    print(f"{'cluster':>7} {'members':>7}  {'domains':32} " + " ".join(f"{'B=' + str(b) + ' actual/pred':>24}" for b in (8, 16, 44)))
    for k in range(K):
        members = members_of.get(k, [])
        if not members:
            continue
        doms = {}
        for m in members:
            doms[dom[m]] = doms.get(dom[m], 0) + 1
        cells = []
        for B in (8, 16, 44):
            pred = np.sum(1 - np.power(1 - q[k], B))
            actual = []
            for _ in range(samples):
                seen = np.zeros((L, E), bool)
                for m in rng.choice(members, size=B, replace=len(members) < B):
                    t = off[m] + pl[m] + rng.integers(nt[m] - pl[m])
                    seen[np.arange(L)[:, None], ids[t]] = True
                actual.append(seen.sum())
            cells.append(f"{np.mean(actual):7.0f} / {pred:6.0f} = {np.mean(actual) / pred:5.3f}")
        top = ", ".join(f"{d} {n}" for d, n in sorted(doms.items(), key=lambda x: -x[1])[:2])
        print(f"{k:>7} {len(members):>7}  {top:32} " + " ".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
