"""MHLA in plain torch ops, one module per form, as flash-linear-attention keeps each op's forms
side by side:

- ``naive``: the dense form written from the operator's definition (docs/operator.md),
  ``A[t, s] = W[blk(t), blk(s)] phi(q_t) . phi(k_s)``, N x N memory, small shapes only; the
  tests' reference for the C++ operator and for the other forms;
- ``einsum``: the paper authors' ten-line einsum formulation (non-causal, elu + 1, tokens in
  block order), the yardstick of the chunked form's bfloat16 error and GPU speed;
- ``chunk``: the chunked form, every mode of the operator in ``O(N (Dk + Dv) + M Dk Dv)``
  memory, differentiated by torch's autograd (twice, too): the path inside ``torch.compile``,
  whose compiler fuses its ops;
- ``lean``: the chunked form in the fewest ops, its backward written by hand: ``mhla.torch``'s
  path for tensors on any device;
- ``recurrent``: the streaming causal decoder (prefill, step) with its state in torch tensors.

``python/tests/test_torch_forms.py`` checks them against each other and against the C++ operator.
"""
