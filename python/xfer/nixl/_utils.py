"""NIXL's nixl._utils: raw host memory for tests and examples, by address (an int), as NIXL's
tests and examples use it with descriptors."""

import ctypes

_libc = ctypes.CDLL(None, use_errno=True)
_libc.aligned_alloc.restype = ctypes.c_void_p
_libc.aligned_alloc.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
_libc.free.restype = None
_libc.free.argtypes = (ctypes.c_void_p,)

ALIGNMENT = 4096  # (as NIXL's: storage I/O with O_DIRECT wants block-aligned buffers)

__all__ = ["malloc_passthru", "free_passthru", "ba_buf", "verify_transfer"]


def _size(size):
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"a size is an int >= 0, not {size!r}")
    return size


def _address(addr):
    if not isinstance(addr, int) or isinstance(addr, bool) or addr <= 0:
        raise ValueError(f"an address is an int > 0 (from malloc_passthru), not {addr!r}")
    return addr


def malloc_passthru(size):
    """The address of size new bytes (uninitialized), aligned to 4096; free with free_passthru.
    MemoryError when they cannot be had."""
    rounded = -(-_size(size) // ALIGNMENT) * ALIGNMENT or ALIGNMENT  # (aligned_alloc wants multiples)
    addr = _libc.aligned_alloc(ALIGNMENT, rounded)
    if not addr:
        raise MemoryError(f"malloc_passthru: {size} bytes could not be allocated")
    return addr


def free_passthru(addr):
    """Frees what malloc_passthru gave (the address, once)."""
    _libc.free(_address(addr))


def ba_buf(addr, size):
    """Fills size bytes at addr with 0xba."""
    ctypes.memset(_address(addr), 0xBA, _size(size))


def verify_transfer(addr1, addr2, size):
    """Checks that size bytes at addr1 and addr2 are equal: AssertionError naming the first offset
    where they differ (NIXL's C assert may be compiled out; this one always checks)."""
    a = ctypes.string_at(_address(addr1), _size(size))
    b = ctypes.string_at(_address(addr2), size)
    if a != b:
        at = next(i for i in range(size) if a[i] != b[i])
        raise AssertionError(f"verify_transfer: the bytes differ at offset {at} "
                             f"({a[at]:#04x} at {addr1 + at:#x}, {b[at]:#04x} at {addr2 + at:#x})")
