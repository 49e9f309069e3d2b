# SPDX-License-Identifier: Apache-2.0
"""gshm.torch.StateDict, in a module of its own: gshm.torch and the pool
(gshm._torch_pool) both return it, and the pool is imported by gshm.torch,
so the class lives below both of them."""

from typing import Any, Dict, Optional


class StateDict(dict):  # type: ignore[type-arg]  (dict[str, torch.Tensor]; torch may lack stubs)
    """What load_state_dict and attach return: a dict of tensors, plus where they live.

    info     the segment's SegmentInfo (load_state_dict)
    address  the segment's mapped address in this process (device address for
             GPU segments); every tensor's data_ptr() lies in
             [address, address + info.size)
    metadata the safetensors __metadata__, or the metadata given to publish
    buffers  attach(): non-persistent buffers of a published module
    segments attach(): {segment name: SegmentInfo}"""

    info: Any = None
    address: Optional[int] = None
    metadata: Optional[Dict[str, Any]] = None
    buffers: Optional[Dict[str, Any]] = None
    segments: Optional[Dict[str, Any]] = None
