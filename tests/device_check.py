"""CUDA's device-placement rules on a CPU-only machine, to test that code keeps its tensors on its inputs' device.

Inside `with SimulatedDevice() as dev:`, `dev.put(t)` is a tensor that reports `device == dev.device` (the `meta`
device stands in for cuda:0) but carries t's CPU data. Every op on such tensors computes on that data and returns
tensors on the simulated device again; tensors created with `device=dev.device` (factories, `.to`, `torch.tensor`)
land there too, while tensors created without a device land on the CPU, as they would on a GPU machine. As on
CUDA, an op that mixes a simulated-device tensor with a CPU tensor raises, except for a 0-dim CPU scalar, a copy
(`.to`, `copy_`) or CPU indices, which CUDA accepts. `.tolist()`, `int()`, `float()` and `.cpu()` read data back.
The tensors are only usable inside the `with` block.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("meta")
aten = torch.ops.aten
# Ops CUDA runs with a CPU operand: copies between devices, and CPU index tensors.
CROSS_DEVICE = {aten.copy_.default, aten._to_copy.default, aten.index.Tensor}


class OnDevice(torch.Tensor):
    """A CPU tensor (`elem`) presented as living on DEVICE."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(),
                                                  storage_offset=elem.storage_offset(), dtype=elem.dtype, device=DEVICE)
        out.elem = elem
        return out

    def __init__(self, elem: torch.Tensor):
        super().__init__()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on a simulated-device tensor outside `with SimulatedDevice()`")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:  # C++ refuses tolist() on subclasses; read the data instead
            return args[0].elem.tolist()
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _is_device(device) -> bool:
    return device is not None and torch.device(device).type == DEVICE.type


def _wrap(out):
    return tree_map(lambda t: OnDevice(t) if isinstance(t, torch.Tensor) and not isinstance(t, OnDevice) else t, out)


def _unwrap(tree):
    return tree_map(lambda t: t.elem if isinstance(t, OnDevice) else t, tree)


def _check_operands(func, leaves: list, on_device: bool) -> None:
    for x in leaves:
        if not isinstance(x, torch.Tensor) or isinstance(x, OnDevice):
            continue
        if x.device.type == DEVICE.type:
            raise RuntimeError(f"{func}: a tensor was made on {DEVICE.type} outside the simulation")
        if on_device and x.dim() > 0 and func not in CROSS_DEVICE:
            raise RuntimeError(f"Expected all tensors to be on the same device: {func} mixes a CPU tensor of shape "
                               f"{tuple(x.shape)} with simulated-device ({DEVICE.type}) tensors")


class _Ops(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        leaves = tree_flatten((args, kwargs))[0]
        on_device = any(isinstance(x, OnDevice) for x in leaves)
        _check_operands(func, leaves, on_device)
        to_device = _is_device(kwargs.get("device"))
        if to_device:
            kwargs["device"] = torch.device("cpu")
        out = func(*_unwrap(args), **_unwrap(kwargs))
        # Results follow the inputs unless the op names a device (a factory, `.to(device)`).
        return _wrap(out) if to_device or (on_device and kwargs.get("device") is None) else out


class _Factories(TorchFunctionMode):
    """torch.tensor / as_tensor of Python data with device=DEVICE: C++ would make a data-less meta tensor."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and _is_device(kwargs.get("device")) and not (
                args and isinstance(args[0], torch.Tensor)):
            return OnDevice(func(*args, **{**kwargs, "device": "cpu"}))
        return func(*args, **kwargs)


class SimulatedDevice:
    device = DEVICE

    def __enter__(self) -> SimulatedDevice:
        self._modes = [_Factories(), _Ops()]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def put(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """t's data on the simulated device (None stays None)."""
        return None if t is None else OnDevice(t.detach().cpu())


class CopiesToDevice(TorchDispatchMode):
    """Inside a SimulatedDevice: records the element count of every copy from the CPU onto the simulated device
    (what a CUDA host would send over PCIe), in `sizes`."""

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        src = args[1] if func is aten.copy_.default else args[0]
        to_device = _is_device(kwargs.get("device")) or (func is aten.copy_.default and isinstance(args[0], OnDevice))
        if func in (aten._to_copy.default, aten.copy_.default) and to_device and not isinstance(src, OnDevice):
            self.sizes.append(src.numel())
        return func(*args, **kwargs)
