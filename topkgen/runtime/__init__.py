"""The consumer side: load a bundle, pick kernels by looking them up in the manifest's
dispatch table (`select`'s answers as data: no rule is evaluated per call), and
JIT-compile what the bundle leaves to JIT from the CUDA source it ships (or, for an arch
the bundle lacks, from the same templates and the policy the manifest embeds).

topk.py holds the front end (`TopK`), backend.py what both backends share (launch data and
argument checks), cuda_backend.py and emulator_backend.py one backend each; reference.py is
the CPU reference the tests compare with. `from topkgen.runtime import TopK` stays the way in.
"""

from __future__ import annotations

from topkgen.runtime.backend import (Launch, NoGpuError, TopKError, arguments, dtype_name, launch_arguments,
                                     launch_shared_bytes)
from topkgen.runtime.cuda_backend import allow_dynamic_shared, array_device, check_device, gpu_unavailable, pointer_device
from topkgen.runtime.topk import BACKENDS, TopK, jit_disabled

__all__ = ["BACKENDS", "Launch", "NoGpuError", "TopK", "TopKError", "allow_dynamic_shared", "arguments", "array_device",
           "check_device", "dtype_name", "gpu_unavailable", "jit_disabled", "launch_arguments", "launch_shared_bytes",
           "pointer_device"]
