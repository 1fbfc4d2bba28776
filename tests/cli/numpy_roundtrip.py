"""`mhla forward` on files written by NumPy itself (format versions 1.0 and
3.0, float32 and float64, and a compressed .npz), checked against MHLA
written here in NumPy from the definition. Exits 77 (CTest: skipped) when NumPy is missing.

usage: numpy_roundtrip.py PATH_TO_MHLA WORK_DIR
"""
import os
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("numpy not installed: skipped")
    sys.exit(77)


def mhla_forward(q, k, v, w, block, eps=1e-6):
    """Non-causal 1D MHLA, elu+1 features, normalized; q, k, v [B, N, H, D]."""
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(x))
    n = q.shape[1]
    blocks = [slice(s, min(s + block, n)) for s in range(0, n, block)]
    u, kap = phi(q), phi(k)
    out = np.empty_like(v)
    s = [np.einsum("bnhd,bnhe->bhde", kap[:, b], v[:, b]) for b in blocks]
    z = [kap[:, b].sum(axis=1) for b in blocks]  # [B, H, D]
    for i, bi in enumerate(blocks):
        s_mix = sum(w[i, j] * s[j] for j in range(len(blocks)))
        z_mix = sum(w[i, j] * z[j] for j in range(len(blocks)))
        num = np.einsum("bnhd,bhde->bnhe", u[:, bi], s_mix)
        den = np.einsum("bnhd,bhd->bnh", u[:, bi], z_mix)[..., None] + eps
        out[:, bi] = num / den
    return out


def main():
    mhla, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    b, n, h, d, block = 2, 29, 3, 8, 5
    m = -(-n // block)
    for dtype, version in ((np.float32, (1, 0)), (np.float64, (3, 0))):
        q, k, v = (rng.standard_normal((b, n, h, d)).astype(dtype) for _ in range(3))
        w = rng.uniform(0.05, 1.0, (m, m)).astype(dtype)
        paths = {}
        for name, array in (("q", q), ("k", k), ("v", v), ("w", w)):
            paths[name] = os.path.join(work, f"{name}-{np.dtype(dtype).name}.npy")
            with open(paths[name], "wb") as f:
                np.lib.format.write_array(f, array, version=version)
        out_dir = os.path.join(work, np.dtype(dtype).name)
        subprocess.run([mhla, "forward", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
                        "--w", paths["w"], "--block", str(block), "--out-dir", out_dir, "--force"],
                       check=True)
        o = np.load(os.path.join(out_dir, "o.npy"))
        assert o.dtype == dtype and o.shape == v.shape, (o.dtype, o.shape)
        want = mhla_forward(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                            w.astype(np.float64), block)
        err = np.abs(o - want).max() / max(1.0, np.abs(want).max())
        tol = 2e-5 if dtype == np.float32 else 1e-12
        print(f"{np.dtype(dtype).name} (.npy {version[0]}.{version[1]}): max relative error {err:.2e}")
        assert err <= tol, f"error {err} above {tol}"
        # The same inputs as one compressed .npz archive.
        archive = os.path.join(work, f"qkvw-{np.dtype(dtype).name}.npz")
        np.savez_compressed(archive, q=q, k=k, v=v, w=w)
        npz_dir = out_dir + "-npz"
        subprocess.run([mhla, "forward", "--inputs", archive, "--block", str(block), "--out-dir", npz_dir,
                        "--force"], check=True)
        assert np.array_equal(np.load(os.path.join(npz_dir, "o.npy")), o), "npz input gave other outputs"
    print("numpy round trip: ok")


main()
