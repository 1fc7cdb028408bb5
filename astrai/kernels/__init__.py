"""Python side of csrc/: build and load the CUDA kernels, their torch custom ops, and a
pure-torch reference of each (the spec they are tested against).

    from astrai.kernels import paged_decode, paged_prefill, rotary_

The ops run the CUDA kernels on CUDA tensors and the references on the CPU; see
`astrai.kernels.status.kernel_status()` for what is built and why something is not.
"""

from astrai.kernels.ops import paged_decode, paged_prefill, rotary_
from astrai.kernels.reference import paged_decode_ref, paged_prefill_ref, rotary_ref_

__all__ = [
           "paged_decode",
           "paged_decode_ref",
           "paged_prefill",
           "paged_prefill_ref",
           "rotary_",
           "rotary_ref_",
]
