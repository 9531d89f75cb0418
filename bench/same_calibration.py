# Whether two calibration.h5 files hold the same calibration: every dataset byte for byte (strings by value) and
# every attribute equal, but the root attribute `created`. Usage: /usr/bin/python3 bench/same_calibration.py A B
import h5py, sys, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
names = []
a.visit(names.append)
nb = []; b.visit(nb.append)
assert sorted(names) == sorted(nb), (set(names) ^ set(nb))
n = 0
for k in names:
    x, y = a[k], b[k]
    for at in set(x.attrs) | set(y.attrs):
        assert np.array_equal(np.asarray(x.attrs[at]), np.asarray(y.attrs[at])), (k, at)
    if isinstance(x, h5py.Dataset):
        assert x.dtype == y.dtype and x.shape == y.shape, k
        vx, vy = x[()], y[()]
        assert (vx.tolist() == vy.tolist()) if vx.dtype == object else (vx.tobytes() == vy.tobytes()), k
        n += 1
ra = {k: v for k, v in a.attrs.items() if k != 'created'}
rb = {k: v for k, v in b.attrs.items() if k != 'created'}
assert ra.keys() == rb.keys() and all(np.array_equal(ra[k], rb[k]) for k in ra)
print(f"{sys.argv[1]} == {sys.argv[2]}: {n} datasets byte-identical, attributes equal except 'created'")
