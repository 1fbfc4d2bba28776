"""`mhla forward` on broken or endless input files: each must end promptly in a
non-zero exit with a named error, never in an output, a hang or a read that
runs until memory is gone. Exits 77 (CTest: skipped) when NumPy is missing.

usage: bad_files.py PATH_TO_MHLA WORK_DIR
"""
import os
import subprocess
import sys
import time

try:
    import numpy as np
except ImportError:
    print("numpy not installed: skipped")
    sys.exit(77)


def refused(mhla, work, args, expected):
    """Runs `mhla forward ARGS`; it must fail within 10 s, naming `expected`, and write no output."""
    out = os.path.join(work, "out")
    start = time.monotonic()
    r = subprocess.run([mhla, "forward", *args, "--block", "4", "--out-dir", out, "--force"],
                       capture_output=True, text=True, timeout=30)
    took = time.monotonic() - start
    message = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    print(f"{' '.join(args)}: exit {r.returncode} after {took:.2f} s: {message}")
    assert r.returncode != 0, "accepted"
    assert expected in r.stderr, f"expected {expected!r} in {r.stderr!r}"
    assert took < 10, f"took {took:.1f} s"
    assert not os.path.exists(os.path.join(out, "o.npy")), "an output was written"


def flip_in_member(path, member_data, offset):
    """Flips one bit of the archive byte `offset` bytes into the first copy of `member_data`."""
    z = bytearray(open(path, "rb").read())
    i = z.find(member_data)
    assert i >= 0
    z[i + offset] ^= 4
    open(path, "wb").write(z)


def main():
    mhla, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    r = np.random.default_rng(0)
    arrays = dict(q=r.random((1, 16, 2, 3)), k=r.random((1, 16, 2, 3)), v=r.random((1, 16, 2, 4)))

    # A stored member (np.savez) with one flipped data byte: only its CRC-32 can tell.
    stored = os.path.join(work, "stored.npz")
    np.savez(stored, **arrays)
    flip_in_member(stored, b"\x93NUMPY", 135)
    refused(mhla, work, ["--inputs", stored], "bad CRC-32")

    # A deflated member (np.savez_compressed) with one flipped bit in its compressed data.
    deflated = os.path.join(work, "deflated.npz")
    np.savez_compressed(deflated, **arrays)
    z = open(deflated, "rb").read()
    first = z.find(b"q.npy") + len(b"q.npy")  # the local header's name; the data follows
    flip_in_member(deflated, z[first:first + 64], 40)
    refused(mhla, work, ["--inputs", deflated], "q.npy]")

    good = {}
    for name, a in arrays.items():
        good[name] = os.path.join(work, f"{name}.npy")
        np.save(good[name], a)
    others = ["--k", good["k"], "--v", good["v"]]

    # Endless or special files: refused before anything is read.
    refused(mhla, work, ["--q", "/dev/zero", *others], "not a regular file")
    fifo = os.path.join(work, "q.fifo")
    if os.path.exists(fifo):
        os.remove(fifo)
    os.mkfifo(fifo)
    refused(mhla, work, ["--q", fifo, *others], "FIFO")
    refused(mhla, work, ["--inputs", fifo], "FIFO")
    refused(mhla, work, ["--q", work, *others], "directory")

    # A huge file of the wrong kind (sparse: no disk is used): refused by its magic.
    huge = os.path.join(work, "huge.bin")
    with open(huge, "wb") as f:
        f.truncate(8 << 30)
    refused(mhla, work, ["--q", huge, *others], "not a .npy file")
    # A .npy header that announces more data than the file holds: refused before the data is read.
    short = os.path.join(work, "short.npy")
    with open(good["q"], "rb") as f:
        head = f.read(128)
    with open(short, "wb") as f:
        f.write(head)
    refused(mhla, work, ["--q", short, *others], "truncated or extra data")
    print("bad files: ok")


main()
