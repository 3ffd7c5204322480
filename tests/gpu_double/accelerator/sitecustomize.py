"""torch as a CUDA build reports itself on a GPU node, on this CPU machine: its accelerator is CUDA.

On PYTHONPATH, every Python started there (the ranks) imports torch at start and finds
torch._C._get_accelerator() (what fully_shard's default mesh, barrier and init_process_group's default
backend read) and torch.accelerator.current_accelerator() answering `cuda`, although no CUDA runs. A
lesson run on the CPU must still keep every tensor there: one that leans on torch's implicit device
moves to `cuda` and fails here, as it would misplace tensors on a GPU node.
"""
import torch

_CUDA = torch.device("cuda")
torch._C._get_accelerator = lambda check=False: _CUDA
torch._C._accelerator_getAccelerator = lambda: _CUDA
