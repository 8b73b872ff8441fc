"""The bytes of a compiled graph's fused CPU kernels: the buffers each call is handed.

inductor's CPU kernels are called by name from its generated Python modules, with pointers to the
buffers they read (``in_ptr``), write (``out_ptr``) or both (``in_out_ptr``). While a
``KernelBytes`` is entered, each kernel of the modules loaded so far is wrapped to note, call by
call, the bytes of those buffers under the name of its profiler range; on exit the kernels are put
back. It is the op table's convention for every op (the tensors an op takes and returns), so a
fused kernel is held against the memory roof like any other: one that reads part of a buffer moves
less than this, one that reads a buffer twice moves more.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque

# The op table's name for a compiled graph's fused kernel: this prefix and its profiler range. Here
# (torch imported only when kernels are wrapped) so that the report reads it without torch.
FUSED_OP = "inductor."
# one kernel of a generated module: its name, and its C++ source (signature and profiler range)
_KERNEL = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\(\[[^\]]*\], r'''(.*?)'''\)", re.M | re.S)
_PARAMS = re.compile(r'extern "C"\s+void\s+kernel\((.*?)\)\s*\{', re.S)
_RECORD = re.compile(r'RAIIAtenRecordFunctionHandle \w+\("([^"]+)"')


def _roles(params: str) -> list[str | None]:
    """Each parameter's role, read (``in``), written (``out``), both (``in_out``) or none (a size)."""
    roles = []
    for param in params.split(","):
        name = param.split()[-1] if param.split() else ""
        roles.append(next((r for r in ("in_out", "in", "out") if name.startswith(f"{r}_ptr")), None))
    return roles


def kernels(source: str) -> list[tuple[str, str, list[str | None]]]:
    """(name in the module, profiler range, parameter roles) of each CPU kernel in ``source``."""
    found = []
    for name, body in _KERNEL.findall(source):
        record, params = _RECORD.search(body), _PARAMS.search(body)
        if record and params:
            found.append((name, record.group(1), _roles(params.group(1))))
    return found


class KernelBytes:
    """While entered, the (read, written) bytes of every fused CPU kernel call, by profiler range."""

    def __init__(self):
        self.calls: dict[str, deque] = defaultdict(deque)
        self._wrapped: list[tuple[dict, str, object]] = []

    def __enter__(self):
        import torch
        from torch._inductor.codecache import PyCodeCache

        seen = set()
        for module in list(PyCodeCache.modules):
            path = getattr(module, "__file__", None)
            if path is None or id(module) in seen:
                continue
            seen.add(id(module))
            try:
                with open(path) as f:
                    source = f.read()
            except OSError:  # its cache folder removed since (a test's fresh inductor cache)
                continue
            space = module.__dict__
            for name, record, roles in kernels(source):
                if callable(space.get(name)):
                    self._wrapped.append((space, name, space[name]))
                    space[name] = self._counted(space[name], self.calls[record], roles, torch.Tensor)
        return self

    def __exit__(self, *exc):
        for space, name, kernel in reversed(self._wrapped):
            space[name] = kernel
        self._wrapped.clear()
        return False

    def take(self, record: str) -> tuple[int, int]:
        """The next call's (read, written) of the kernel whose profiler range is ``record``; (0, 0)
        for one not wrapped (compiled after the enter, or a source this does not read)."""
        calls = self.calls.get(record)
        return calls.popleft() if calls else (0, 0)

    @staticmethod
    def _counted(kernel, calls: deque, roles: list[str | None], tensor: type):
        def counted(*args):
            read = written = 0
            for arg, role in zip(args, roles):
                if role is not None and isinstance(arg, tensor):
                    n = arg.numel() * arg.element_size()
                    read += n if role != "out" else 0
                    written += n if role != "in" else 0
            calls.append((read, written))
            return kernel(*args)

        return counted
