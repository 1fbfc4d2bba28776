"""The OpenMP runtime the operator runs on: one per process, shared with torch; and fork().

Python forks workers (multiprocessing, torch's DataLoader) from a process that has already run
the operator on several threads; the OpenMP runtime's worker pool is not copied by fork(), so
without the library's fork handler the child's first parallel region waits forever. Each case
runs in a fresh interpreter, so that it controls what is imported first: with torch imported
first the extension shares torch's OpenMP runtime, and torch's own ops must not hang either.
"""
import os
import re
import subprocess
import sys

import package_location
import pytest

SCRIPT = """
import os, signal, sys
array = sys.argv[1]
if array == "torch":
    import torch
    import mhla, mhla.torch
    make, same = torch.randn, torch.equal
    def call():
        layout = mhla.Layout.sequence(2048, 128)
        w = torch.from_numpy(mhla.init_mixing(layout))
        (torch.ones(256, 256) @ torch.ones(256, 256)).sum()  # torch's own pool, used in the parent
        return mhla.torch.mhla_attention(q, q, q, w, layout)
else:
    import numpy as np
    import mhla
    make, same = (lambda *shape: np.random.default_rng(0).standard_normal(shape, dtype=np.float32)), np.array_equal
    def call():
        layout = mhla.Layout.sequence(2048, 128)
        return np.asarray(mhla.forward(q, q, q, mhla.init_mixing(layout), layout=layout))
q = make(1, 2048, 2, 32)
in_parent = call()
child = os.fork()
if child == 0:
    signal.alarm(20)  # a hung child ends by SIGALRM
    os._exit(0 if same(call(), in_parent) else 1)
_, status = os.waitpid(child, 0)
sys.exit(f"the child ended with status {os.waitstatus_to_exitcode(status)} (-14: it hung)" if status else 0)
"""


@pytest.mark.parametrize("array", ["torch", "numpy"])
def test_a_child_forked_after_a_threaded_call_computes_the_same_result(array):
    pytest.importorskip(array)
    run = subprocess.run([sys.executable, "-c", SCRIPT, array], capture_output=True, text=True, timeout=120,
                         env=package_location.subprocess_env(OMP_NUM_THREADS="2"))
    assert run.returncode == 0, run.stderr[-3000:]


BINDINGS = """
import sys
if sys.argv[1] == "mhla":
    import mhla, torch
else:
    import torch, mhla
layout = mhla.Layout.sequence(2048, 128)
q = torch.randn(1, 2048, 2, 32)
import mhla.torch
mhla.torch.mhla_attention(q, q, q, torch.from_numpy(mhla.init_mixing(layout)), layout)
torch.randn(1 << 22).exp_().sum()  # torch's parallel ops, bound here if torch binds lazily
"""


@pytest.mark.parametrize("first", ["mhla", "torch"])
def test_the_extension_runs_on_the_openmp_runtime_torch_runs_on_whichever_is_imported_first(first):
    # Two runtimes' idle workers spin on the cores the other's next region needs (docs/packaging.md);
    # the dynamic linker says where each library's GOMP_parallel went.
    pytest.importorskip("torch")
    run = subprocess.run([sys.executable, "-c", BINDINGS, first], capture_output=True, text=True, timeout=120,
                         env=package_location.subprocess_env(LD_DEBUG="bindings"))
    assert run.returncode == 0, run.stderr[-3000:]
    targets = {}
    for caller, target in re.findall(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `GOMP_parallel'",
                                     run.stderr):
        name = os.path.basename(caller)
        if name.startswith("_core.") or name.startswith("libtorch_cpu."):
            targets.setdefault(name.split(".")[0], set()).add(os.path.realpath(target))
    assert set(targets) == {"_core", "libtorch_cpu"}, f"bindings seen: {targets}"
    assert targets["_core"] == targets["libtorch_cpu"] and len(targets["_core"]) == 1, targets
