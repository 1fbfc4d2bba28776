"""The GPU check of mhla.torch's pure-torch path, in one command.

On a machine with a CUDA device it
1. runs python/tests/test_torch_forms.py with the torch path on CUDA tensors, against the C++
   operator on the CPU (MHLA_TEST_DEVICE=cuda), and python/tests/test_cuda_tensors.py (CUDA
   tensors through mhla.forward/backward, in a build with the CUDA backend) and
   python/tests/test_contract.py (the deferred finite check on CUDA);
2. times forward and forward+backward of mhla.torch.mhla_attention at four shapes (bf16, B = 1), on
   its default path and on the library's CUDA kernels (backend="cpp", in a build with the CUDA
   backend), next to the chunked form under torch's autograd (what the default path's hand-written
   ops replace), the plain einsum formulation (non-causal shapes) and SDPA's FlashAttention and cuDNN
   backends in the same process (medians of CUDA-event
   timings), with the peak memory of MHLA's forward+backward;
3. runs every kernel family of each dtype (``FAMILIES``: the plain-torch path and the library's CUDA
   kernels) at the four shapes, compares o and the four gradients with the C++ operator in float64
   on the CPU on the same rounded inputs, and times forward and forward+backward;
4. prints the tables and writes them as JSON, and with ``--dispatch-table`` the measured table
   ``mhla.torch`` reads as its defaults (python/mhla/_cuda_dispatch.py): for each dtype, masking,
   shape class and inference or training, the fastest family that passed, where it beats the
   plain-torch path.
Without a CUDA device it says so and exits 0: there is nothing to check.

    PYTHONPATH=build/python python3 bench/gpu_check.py [--json bench/results/gpu-check.json] [--skip-tests] [--workers N]
        [--dispatch-table python/mhla/_cuda_dispatch.py]
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

import torch

import mhla
import mhla.torch as mt
from mhla import _plan
from mhla._torch_forms import chunk
from mhla._torch_forms.einsum import einsum_mhla

# (name, tokens, heads, head dim, layout, masking): the anchor shapes of docs/python.md. The video shape is
# Wan2.1's 21 x 30 x 50 latent grid in 1 x 15 x 10 tiles: 210 blocks of 150 tokens.
SHAPES = [
    ("4,096 tokens, 8 x 64, M = 64", 4096, 8, 64, mhla.Layout.sequence(4096, 64), "none"),
    ("65,536 tokens, 8 x 64, M = 256", 65536, 8, 64, mhla.Layout.sequence(65536, 256), "none"),
    ("video 31,500 tokens, 12 x 128, M = 210", 31500, 12, 128, mhla.Layout.grid3d(21, 30, 50, 1, 15, 10), "none"),
    ("causal 65,536 tokens, 8 x 64, M = 256", 65536, 8, 64, mhla.Layout.sequence(65536, 256), "causal"),
]


def median_ms(fn, repeats=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def fwd_and_fwdbwd(forward, inputs):
    """Median ms of forward alone and of forward + backward (a random upstream gradient)."""
    with torch.no_grad():
        fwd = median_ms(lambda: forward(*inputs))
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    grad = torch.randn_like(forward(*leaves))

    def step():
        for t in leaves:
            t.grad = None
        forward(*leaves).backward(grad)

    return fwd, median_ms(step)


def sdpa(backend_name, causal):
    """SDPA restricted to one backend; None where this torch lacks the way to ask for it."""
    attention = getattr(torch.nn, "attention", None)
    if attention is None or not hasattr(attention.SDPBackend, backend_name):
        return None
    backend = getattr(attention.SDPBackend, backend_name)

    def run(q, k, v):  # [B, N, H, D] like mhla's
        with attention.sdpa_kernel(backend):
            o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                 v.transpose(1, 2), is_causal=causal)
        return o.transpose(1, 2)

    return run


def time_shape(name, tokens, heads, dim, layout, masking, rounds=2):
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, tokens, heads, dim, device=device, dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    w = torch.as_tensor(mhla.init_mixing(layout, causal=masking == "causal")).to(device)
    row = {"shape": name, "tokens": tokens, "heads": heads, "dim": dim, "blocks": layout.num_blocks,
           "masking": masking}

    def ours(q, k, v):
        return mt.mhla_attention(q, k, v, w, layout, masking=masking)

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    ours(*leaves).backward(torch.randn(1, tokens, heads, dim, device=device, dtype=torch.bfloat16))
    torch.cuda.synchronize()
    row["mhla_fwdbwd_peak_mib_above_inputs"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    contenders = {"mhla": ours, "mhla_kernels": None, "einsum": None,
                  # The chunked form under torch's autograd: what the lean form's hand-written ops replace.
                  "chunked": lambda q, k, v: chunk.mhla_attention(q, k, v, w, layout, masking=masking)}
    if mhla._core.has_cuda_backend:  # mhla.torch on the library's CUDA kernels
        contenders["mhla_kernels"] = lambda q, k, v: mt.mhla_attention(q, k, v, w, layout, masking=masking,
                                                                       backend="cpp")
    if masking == "none":  # tokens taken as in block order: a timing, not a check, for 2D and 3D layouts
        w_reduced = w.to(torch.bfloat16)
        contenders["einsum"] = lambda q, k, v: einsum_mhla(q, k, v, w_reduced, tokens // layout.num_blocks)
    for label, backend_name in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION")):
        contenders[label] = sdpa(backend_name, masking == "causal")
    # Two interleaved rounds, each contender's faster median kept: the order of the timings
    # (clocks, caches, the allocator's state) moves a median by several percent.
    for label in contenders:
        row[f"{label}_fwd_ms"] = row[f"{label}_fwdbwd_ms"] = None
    for _ in range(rounds):
        for label, run in contenders.items():
            if run is None:
                continue
            try:
                fwd, fwdbwd = fwd_and_fwdbwd(run, (q, k, v))
            except RuntimeError as error:  # this GPU or build has no such kernel for the shape
                print(f"  {label} at {name}: {str(error).splitlines()[0]}")
                contenders[label] = None
                continue
            for kind, ms in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                kept = row[f"{label}_{kind}_ms"]
                row[f"{label}_{kind}_ms"] = ms if kept is None else min(kept, ms)
    for kind in ("fwd", "fwdbwd"):
        for ours_label in ("mhla", "mhla_kernels"):
            for other in ("cudnn", "einsum", "chunked"):
                mine, theirs = row[f"{ours_label}_{kind}_ms"], row[f"{other}_{kind}_ms"]
                row[f"{ours_label}_over_{other}_{kind}"] = mine / theirs if mine and theirs else None
    return row


# The kernel families a CUDA call can run on, per dtype: (name, dtype, backend, cuda_kernels).
FAMILIES = [
    ("torch", torch.bfloat16, "torch", None),
    ("split_operand", torch.bfloat16, "cpp", ()),
    ("bf16_state", torch.bfloat16, "cpp", ("bf16_state",)),
    ("torch", torch.float16, "torch", None),
    ("float16_tensor_cores", torch.float16, "cpp", ("float16_tensor_cores",)),
    ("float16_state", torch.float16, "cpp", ("float16_tensor_cores", "bf16_state")),
    ("torch", torch.float32, "torch", None),
    ("one_thread_per_result", torch.float32, "cpp", ()),
    ("float32_tensor_cores", torch.float32, "cpp", ("float32_tensor_cores",)),
]
# The largest error a family may show against float64 on the same rounded inputs, in units of each
# result's largest magnitude: o, grad q, k, v, and grad w (whose products cancel most).
TOLERANCES = {torch.bfloat16: (1e-2, 0.06), torch.float16: (1e-2, 0.15), torch.float32: (1e-3, 1e-3)}
def reference(q, k, v, w, grad_o, layout, masking):
    """o and the four gradients of the C++ operator in float64 on the CPU."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v, w)]
    o = mt.mhla_attention(*leaves, layout, masking=masking, backend="cpp")
    return [o.detach(), *torch.autograd.grad(o, leaves, grad_o.cpu().double())]


def relative_errors(got, want):
    return [float((a.double().cpu() - b).abs().max() / b.abs().max().clamp_min(1e-300)) for a, b in zip(got, want)]


def check_families(name, tokens, heads, dim, layout, masking, device="cuda", timer=None):
    """Every family of ``FAMILIES`` at one shape: its errors against float64, pass or fail, and its
    forward and forward+backward times (``timer``, by default ``fwd_and_fwdbwd``; None where the
    family refuses the shape)."""
    timer = timer or fwd_and_fwdbwd
    gen = torch.Generator().manual_seed(1)
    q, k, v, grad_o = (torch.randn(1, tokens, heads, dim, generator=gen) for _ in range(4))
    w = torch.as_tensor(mhla.init_mixing(layout, causal=masking == "causal")).float()
    references, rows = {}, []
    for family, dtype, backend, kernels in FAMILIES:
        rounded = [t.to(dtype) for t in (q, k, v, grad_o)]
        if dtype not in references:  # the exact answer to the inputs as this dtype holds them
            references[dtype] = reference(*rounded[:3], w, rounded[3], layout, masking)
        inputs = [t.to(device) for t in rounded[:3]] + [w.to(device)]

        def attend(q, k, v, w):
            return mt.mhla_attention(q, k, v, w, layout, masking=masking, backend=backend, cuda_kernels=kernels)

        row = dict(shape=name, family=family, dtype=str(dtype).replace("torch.", ""), masking=masking,
                   tokens=tokens, head_dim=dim, backend=backend, cuda_kernels=list(kernels or ()))
        try:
            leaves = [t.detach().requires_grad_() for t in inputs]
            o = attend(*leaves)
            got = [o.detach(), *torch.autograd.grad(o, leaves, rounded[3].to(device))]
            mt.check_finite_results()
            row["errors"] = relative_errors(got, references[dtype])
            row["fwd_ms"], row["fwdbwd_ms"] = timer(attend, inputs)
        except (RuntimeError, ValueError) as error:  # a family that refuses the shape, or fails
            row.update(errors=None, fwd_ms=None, fwdbwd_ms=None, error=str(error).splitlines()[0])
        tolerance, w_tolerance = TOLERANCES[dtype]
        row["passed"] = row["errors"] is not None and max(row["errors"][:4]) <= tolerance and \
            row["errors"][4] <= w_tolerance
        rows.append(row)
        print(f"  {name}: {family:22} {row['dtype']:8} "
              + (f"errors {', '.join(f'{e:.1e}' for e in row['errors'])}  {cell(row['fwd_ms'])} / "
                 f"{cell(row['fwdbwd_ms'])} ms  {'pass' if row['passed'] else 'FAIL'}"
                 if row["errors"] is not None else f"refused: {row['error']}"))
    return rows


def dispatch_rows(families):
    """The measured table's rows from ``check_families``' rows: per dtype, masking, shape class and
    inference or training, the fastest family that passed, where it is a family of the library's
    kernels faster than the plain-torch path (which a call no row covers takes)."""
    rows = []

    def key(r):
        return r["dtype"], r["masking"], _plan.shape_class(r["tokens"], r["head_dim"])

    for dtype, masking, (long_sequence, wide_heads) in sorted({key(r) for r in families}):
        cell_rows = [r for r in families if key(r) == (dtype, masking, (long_sequence, wide_heads))]
        for needs_grad, timing in ((False, "fwd_ms"), (True, "fwdbwd_ms")):
            def worst(family):  # a family's slowest time over the class's shapes
                times = [r[timing] for r in cell_rows if r["family"] == family]
                return None if None in times else max(times)
            passing = {r["family"] for r in cell_rows if r["passed"]} - {
                r["family"] for r in cell_rows if not r["passed"]}
            kernels = [f for f in passing if f != "torch" and worst(f) is not None]
            if not kernels:
                continue
            best = min(kernels, key=worst)
            if worst("torch") is not None and worst("torch") <= worst(best):
                continue
            example = next(r for r in cell_rows if r["family"] == best)
            rows.append(dict(dtype=dtype, masking=masking, needs_grad=needs_grad, long_sequence=long_sequence,
                             wide_heads=wide_heads, path="cpp", cuda_kernels=tuple(example["cuda_kernels"]),
                             family=best))
    return rows


def dispatch_module(device_name, rows):
    """The text of python/mhla/_cuda_dispatch.py for ``rows``."""
    body = "".join(f"    {row!r},\n" for row in rows)
    return ('"""Where ``mhla.torch`` runs a CUDA call by default, measured: for each dtype, masking, shape class\n'
            'and whether the call is differentiated, the fastest kernel family that passed ``bench/gpu_check.py``\n'
            'on the card named here (``--dispatch-table`` writes this file). A call that no row covers takes the\n'
            f'plain-torch path."""\nDEVICE = {device_name!r}\nROWS = (\n{body})\n')


def cell(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="bench/results/gpu-check.json", help="where to write the results")
    parser.add_argument("--skip-tests", action="store_true", help="only the timings")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers for the tests, where installed")
    parser.add_argument("--dispatch-table", help="where to write the measured table (python/mhla/_cuda_dispatch.py)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing to check here")
        return 0
    device_name = torch.cuda.get_device_name()
    print(f"{device_name}, torch {torch.__version__}, mhla {mhla.__version__}")
    tests = None
    if not args.skip_tests:
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, MHLA_TEST_DEVICE="cuda")
        workers = ["-n", str(args.workers)] if args.workers > 1 and importlib.util.find_spec("xdist") else []
        files = [os.path.join(here, "..", "python", "tests", name)
                 for name in ("test_torch_forms.py", "test_cuda_tensors.py", "test_contract.py")]
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, *files],
                               env=env).returncode
        print(f"test_torch_forms.py, test_cuda_tensors.py and test_contract.py on cuda: "
              f"{'passed' if tests == 0 else 'FAILED'}")
    rows = [time_shape(*shape) for shape in SHAPES]
    print("\n| shape | MHLA fwd / fwd+bwd ms | MHLA on the kernels | chunked form | einsum MHLA | FlashAttention | "
          "cuDNN | MHLA / einsum fwd, fwd+bwd | on the kernels / einsum | MHLA / chunked | MHLA / cuDNN fwd, fwd+bwd | "
          "MHLA fwd+bwd peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        times = " | ".join(f"{cell(r[f'{name}_fwd_ms'])} / {cell(r[f'{name}_fwdbwd_ms'])}"
                           for name in ("mhla", "mhla_kernels", "chunked", "einsum", "flash", "cudnn"))
        ratios = " | ".join(f"{cell(r[f'{ours}_over_{name}_fwd'], 2)}, {cell(r[f'{ours}_over_{name}_fwdbwd'], 2)}"
                            for ours, name in (("mhla", "einsum"), ("mhla_kernels", "einsum"), ("mhla", "chunked"),
                                               ("mhla", "cudnn")))
        print(f"| {r['shape']} | {times} | {ratios} | {r['mhla_fwdbwd_peak_mib_above_inputs']:.0f} |")
    print("\nEvery kernel family against float64 on the CPU (errors: o, grad q, k, v, w):")
    families = [row for shape in SHAPES for row in check_families(*shape)]
    table = dispatch_rows(families)
    print("measured table:", *([f"  {r}" for r in table] or ["  no rows (the plain-torch path everywhere)"]),
          sep="\n")
    if args.dispatch_table:
        with open(args.dispatch_table, "w") as f:
            f.write(dispatch_module(device_name, table))
        print(f"wrote {args.dispatch_table}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"device": device_name, "torch": torch.__version__, "tests_exit_code": tests, "shapes": rows,
                   "families": families, "dispatch": table}, f, indent=1)
    print(f"wrote {args.json}")
    return 0 if tests in (None, 0) else 1


if __name__ == "__main__":
    sys.exit(main())
