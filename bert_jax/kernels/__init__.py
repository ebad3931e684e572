"""Kernels below the Flax modules: Pallas kernels (TPU Mosaic, GPU Triton) and custom-VJP functions whose forward
or backward is written by hand, each beside the plain-JAX computation it must equal (its interpret-mode reference
test in tests/).

Models import kernels; a kernel imports no model (tests/test_import_graph.py).
"""
