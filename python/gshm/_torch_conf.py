# SPDX-License-Identifier: Apache-2.0
"""PyTorch allocator settings that gshm's MemPool cannot work under; no
torch import here, so that the check is testable anywhere."""

import re

__all__ = ["check_alloc_conf"]

_EXPANDABLE = re.compile(r"(^|[,\s])expandable_segments\s*:\s*true\b", re.IGNORECASE)


def check_alloc_conf(environ):
    """Raises RuntimeError when environ ($PYTORCH_CUDA_ALLOC_CONF or
    $PYTORCH_ALLOC_CONF) asks for expandable segments: PyTorch does not
    support them with a custom memory pool (pytorch #147851), so gshm
    refuses up front rather than fail inside the model build."""
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        v = environ.get(var, "")
        if _EXPANDABLE.search(v):
            raise RuntimeError(
                "gshm: %s=%r asks for expandable_segments, which PyTorch does not support "
                "with a custom memory pool (pytorch #147851); unset it (or set "
                "expandable_segments:False) in processes that use gshm.torch.MemPool"
                % (var, v))
