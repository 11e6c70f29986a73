"""A second device emulated on the CPU, to catch on a CPU-only machine the tensors a GPU run
would create on the wrong device.

    with FakeCuda() as fake:
        ... run a verb's code path (models built, batches made, losses, decoding) ...
    assert not fake.mixed, fake.mixed

Inside the block every tensor is still a CPU tensor, but each carries where it would live on a
GPU run (a tag): factory functions without ``device=`` follow the default device, which is the
GPU, as under ``attnkit.devices.use_device(cuda)``; ``device="cuda"``/``.to("cuda")``/
``.cuda()`` make a GPU tensor; ``device="cpu"``, ``.cpu()``, ``torch.from_numpy`` and tensors
made outside the block are host tensors; a module's parameters are GPU tensors. Reading
``.device`` of a GPU tensor answers ``cuda`` (so ``torch.zeros(n, device=x.device)`` follows
``x``); every other op's result lives where its inputs do.

``mixed`` records each op that a real GPU would refuse: a host tensor (more than one element)
beside a GPU tensor, GPU indices into a host tensor, ``.numpy()`` of a GPU tensor; ``syncs``
each host read of a GPU tensor (``.item()``, ``.tolist()``, ``bool()``, ``int()``,
``float()``), which waits for the GPU. Each record is (op, the attnkit source line that called
it). ``pin_memory()`` is a no-op (the CPU build has no pinned memory).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import torch
from torch.nn.attention.bias import CausalBias
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

RUN, HOST = "gpu", "host"
GPU = torch.device("cuda")
FACTORIES = {
    torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor,
    torch.as_tensor, torch.randint, torch.rand, torch.randn, torch.randperm, torch.eye,
    torch.linspace, torch.empty_strided, torch.scalar_tensor, torch.tril_indices,
    torch.triu_indices,
}  # fmt: skip
SYNCS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__"}
CROSS_DEVICE_OK = {"copy_", "set_", "record_stream"}  # ops a GPU accepts across devices
INDEXING = {"__getitem__", "index_select", "gather", "take", "index_put_", "__setitem__"}


@dataclass(frozen=True)
class Record:
    """An op (``op``) called from ``where`` (the innermost attnkit source line)."""

    op: str
    where: str


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-3]):
        if "/attnkit/" in frame.filename and "tests/" not in frame.filename:
            return f"{frame.filename.split('/src/')[-1]}:{frame.lineno} {frame.line}"
    return "outside attnkit"


def _name(func) -> str:
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor":
        return f"{owner.__name__}.__get__"
    return getattr(func, "__name__", repr(func))


def _is_gpu(dev) -> bool | None:
    """True for a GPU device argument, False for a host one, None when absent."""
    if dev is None:
        return None
    return torch.device(dev).type == "cuda"


class FakeCuda(TorchFunctionMode):
    """See the module docstring. ``default_gpu``: whether factory functions without a device
    make GPU tensors (the verbs' default-device context)."""

    def __init__(self, default_gpu: bool = True) -> None:
        super().__init__()
        self.default_gpu = default_gpu
        self.tags: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.mixed: list[Record] = []
        self.syncs: list[Record] = []

    # -- tags --------------------------------------------------------------------------------
    def where(self, t: torch.Tensor) -> str:
        """RUN or HOST: where ``t`` would live on a GPU run."""
        tag = self.tags.get(t)
        if tag is None:
            return RUN if isinstance(t, torch.nn.Parameter) else HOST
        return tag

    def _tag(self, out, tag: str):
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                self.tags[leaf] = tag
        return out

    # -- the mode ----------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = _name(func)
        if name in ("device.__get__", "is_cuda.__get__"):
            t = args[0]
            on_gpu = self.where(t) == RUN
            if name == "is_cuda.__get__":
                return on_gpu
            return GPU if on_gpu else func(*args, **kwargs)
        if name == "pin_memory":
            return args[0]
        if name == "is_pinned":
            return False
        if func in FACTORIES:
            gpu = _is_gpu(kwargs.get("device"))
            if gpu:
                kwargs["device"] = "cpu"
            on_gpu = self.default_gpu if gpu is None else gpu
            return self._tag(func(*args, **kwargs), RUN if on_gpu else HOST)
        if name in ("to", "cuda", "cpu"):
            return self._move(func, name, args, kwargs)
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        places = [self.where(t) for t in tensors]
        if name in SYNCS and tensors and places[0] == RUN:
            self.syncs.append(Record(name, _caller()))
        if name == "numpy" and places and places[0] == RUN:
            self.mixed.append(Record(".numpy() of a GPU tensor", _caller()))
        if RUN in places and name not in CROSS_DEVICE_OK:
            self._check_mix(name, tensors, places)
        out = func(*args, **kwargs)
        if name in SYNCS or not places:
            return out
        tag = RUN if RUN in places else HOST
        if name.endswith("_") or name == "__setitem__":  # in place: the target keeps its place
            tag = places[0]
        return self._tag(out, tag)

    def _check_mix(self, name: str, tensors: list, places: list) -> None:
        if name in INDEXING:
            if places[0] == HOST and RUN in places[1:]:
                self.mixed.append(Record(f"{name}: GPU indices into a host tensor", _caller()))
            return
        for t, p in zip(tensors, places):
            if isinstance(t, CausalBias):  # no data: SDPA builds it on the query's device
                continue
            if p == HOST and t.numel() > 1:
                self.mixed.append(Record(f"{name}: a host tensor beside a GPU one", _caller()))
                return

    def _move(self, func, name: str, args, kwargs):
        src = args[0]
        if name == "cuda":
            gpu = True
        elif name == "cpu":
            gpu = False
        else:
            dev = kwargs.get("device")
            for a in args[1:]:
                if isinstance(a, (str, torch.device)):
                    dev = a
                elif isinstance(a, torch.Tensor):
                    dev = GPU if self.where(a) == RUN else "cpu"
            gpu = _is_gpu(dev)
            if gpu:
                if "device" in kwargs:
                    kwargs["device"] = "cpu"
                args = tuple("cpu" if isinstance(a, (str, torch.device)) else a for a in args)
                args = tuple(a if not isinstance(a, torch.Tensor) or a is src else a.cpu()
                             for a in args)  # fmt: skip
        if name == "cuda":
            out = src.clone()
        elif name == "cpu":
            out = src if self.where(src) == HOST else src.clone()
        else:
            out = func(*args, **kwargs)
        if gpu is None:  # a dtype change: stays where it was
            return self._tag(out, self.where(src))
        if out is src and (self.where(src) == RUN) != gpu:
            out = src.clone()
        return self._tag(out, RUN if gpu else HOST)


def on_gpu(fake: FakeCuda, tree) -> bool:
    """Whether every tensor in ``tree`` would be on the GPU."""
    flags = []
    tree_map(lambda x: flags.append(fake.where(x) == RUN) if isinstance(x, torch.Tensor) else x,
             tree)  # fmt: skip
    return all(flags)
