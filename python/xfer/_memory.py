"""What register() accepts: how a Python object names the memory it owns."""

import math

_KINDS = {"host": "host", "cpu": "host", "cuda": "cuda", "gpu": "cuda"}


def _kind(kind):
    name = getattr(kind, "name", kind)  # also an enum member such as MemType.CUDA
    if not isinstance(name, str) or name.lower() not in _KINDS:
        raise ValueError(f'memory kind must be "host" or "cuda", not {kind!r}')
    return _KINDS[name.lower()]


def _interface_range(iface, what):
    """(addr, len) of an __array_interface__ / __cuda_array_interface__ dict."""
    data = iface.get("data")
    if not isinstance(data, tuple):
        raise ValueError(f"{what} without a data pointer cannot be registered")
    addr, readonly = data
    if readonly:
        raise ValueError(f"cannot register read-only memory ({what} says readonly): peers may WRITE it")
    shape = tuple(iface["shape"])
    itemsize = int(iface["typestr"][2:])
    strides = iface.get("strides")
    if strides is not None:
        expected, step = [], itemsize
        for n in reversed(shape):
            expected.insert(0, step)
            step *= n
        if any(n > 1 and s != e for n, s, e in zip(shape, strides, expected)):
            raise ValueError(f"cannot register non-contiguous memory ({what} has strides {strides})")
    return addr, math.prod(shape) * itemsize


def resolve(obj):
    """(addr, len, kind, needs_buffer): the memory obj names. needs_buffer: register it through
    the buffer protocol (which also pins it: a bytearray cannot be resized while registered)."""
    if isinstance(obj, tuple):
        if len(obj) not in (2, 3):
            raise ValueError("a memory tuple is (addr, len) or (addr, len, kind)")
        addr, length = int(obj[0]), int(obj[1])
        return addr, length, _kind(obj[2]) if len(obj) == 3 else "host", False
    cuda = getattr(obj, "__cuda_array_interface__", None)
    if cuda is not None:
        return (*_interface_range(cuda, "__cuda_array_interface__"), "cuda", False)
    if callable(getattr(obj, "data_ptr", None)) and callable(getattr(obj, "element_size", None)):
        # A torch tensor, seen without importing torch.
        if not obj.is_contiguous():
            raise ValueError("cannot register a non-contiguous tensor (call .contiguous() first)")
        kind = "cuda" if getattr(obj, "is_cuda", False) else "host"
        return obj.data_ptr(), obj.numel() * obj.element_size(), kind, False
    try:
        memoryview(obj).release()
        return 0, 0, "host", True
    except TypeError:
        pass
    host = getattr(obj, "__array_interface__", None)
    if host is not None:
        return (*_interface_range(host, "__array_interface__"), "host", False)
    raise TypeError(f"cannot register a {type(obj).__name__}: give an object with the buffer "
                    "protocol, __array_interface__ or __cuda_array_interface__ (numpy arrays, "
                    "torch tensors), or an (addr, len, kind) tuple")
