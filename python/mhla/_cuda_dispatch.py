"""Where ``mhla.torch`` runs a CUDA call by default, measured: for each dtype, masking, shape class
and whether the call is differentiated, the fastest kernel family that passed ``bench/gpu_check.py``
on the card named here (``--dispatch-table`` writes this file). A call that no row covers takes the
plain-torch path. No GPU has written it yet: no rows."""
DEVICE = None
ROWS = ()
