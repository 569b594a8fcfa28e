"""A rank's values as torch tensors on its device, and the two crossings to and from numpy.

Between its segments and its collectives a rank of a multi-rank run holds every value as a
torch tensor on its device (the CPU on gloo, `cuda:LOCAL_RANK` on NCCL): onnxruntime's segments
bind them by pointer and hand theirs back through DLPack, the collectives work on them in place,
so nothing crosses to the host between two steps. numpy is where a step starts and ends (the
feeds, the pooled logits and caches) and where the numpy interpreter computes: these two
functions are the only crossings, views on the CPU (`torch.from_numpy`, `.numpy()`), copies
to and from a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def to_torch(x: Any, device: str = "cpu") -> Any:
    """A numpy array as a torch tensor on `device` (a torch tensor as it is). On the CPU the
    tensor shares the array's memory, unless the array is a view, read-only or of another
    dtype: then it is copied first, since an in-place collective would write through a view
    into a weight or an earlier value. Values travel in fp32 (the interpreter computes in
    fp32) or as the integers they are (int64)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x
    dtype = np.int64 if np.issubdtype(np.asarray(x).dtype, np.integer) else np.float32
    t = torch.from_numpy(np.require(x, dtype=dtype, requirements=["C", "W", "O"]))
    return t if device == "cpu" else t.to(device)


def to_numpy(x: Any) -> np.ndarray:
    """A torch tensor as a numpy array on the host (a view of a CPU tensor's memory); a numpy
    array as it is."""
    if isinstance(x, np.ndarray):
        return x
    return x.detach().cpu().numpy() if x.device.type != "cpu" else x.detach().numpy()
