"""The tensor stream: named tensors as raw bytes in chunks, and their reassembly on the other side.

A tensor travels as a :class:`TensorHeader` (name, dtype, shape, byte size, CRC-32)
declared in the stream's first message, then as :class:`TensorChunk` messages carrying its
raw little-endian bytes in order, ``chunk_bytes`` at a time, so that no message approaches
gRPC's 4 MiB default limit. Pickle is never used: a payload is data, never code. The
receiver (:class:`TensorAssembler`) checks every declared fact before trusting it, and
bounds what it allocates by the declared total, which is itself capped. The envelope
converters of :mod:`proto.codec` put a plan's or an update's tensors on a stream here, behind
the message that declares them.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
from google.protobuf.message import Message
from torch import Tensor

from common.wire.tensors import DEFAULT_MAX_TOTAL_BYTES, WireError
from proto import lorm_pb2 as pb

if sys.byteorder != "little":  # the wire carries little-endian bytes, copied without swapping
    raise ImportError("proto.streams supports little-endian hosts only")

DEFAULT_CHUNK_BYTES = 1 << 20  # payload per chunk message; well under gRPC's 4 MiB default
DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


# ------------------------------------------------------------------------ tensor codec


def _raw_bytes(name: str, tensor: Tensor) -> memoryview:
    """The tensor's bytes, row-major; no copy for a contiguous CPU tensor."""
    if tensor.dtype not in _DTYPE_NAMES:
        raise WireError("tensors.dtype", f"expected one of {sorted(DTYPES)}, got {tensor.dtype}", name)
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data  # bytes of any dtype, bfloat16 included


def declared_of(tensors: Mapping[str, Tensor]) -> tuple[dict[str, tuple[str, tuple[int, ...]]], int]:
    """What a push's headers declare of ``tensors``: name -> (dtype name, shape), and their bytes in all (as the
    coordinator's ``precheck`` reads them off the wire)."""
    for name, t in tensors.items():
        if t.dtype not in _DTYPE_NAMES:
            raise WireError("tensors.dtype", f"expected one of {sorted(DTYPES)}, got {t.dtype}", name)
    declared = {name: (_DTYPE_NAMES[t.dtype], tuple(t.shape)) for name, t in tensors.items()}
    return declared, sum(t.numel() * t.element_size() for t in tensors.values())


def encode(name: str, tensor: Tensor) -> tuple[pb.TensorHeader, memoryview]:
    raw = _raw_bytes(name, tensor)
    header = pb.TensorHeader(
        name=name,
        dtype=_DTYPE_NAMES[tensor.dtype],
        shape=tensor.shape,
        nbytes=raw.nbytes,
        crc32=zlib.crc32(raw),
    )
    return header, raw


def check_chunk_bytes(chunk_bytes: int) -> None:
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes should be a positive integer, got {chunk_bytes}")


def _raw_chunks(name: str, raw: memoryview, chunk_bytes: int) -> Iterator[pb.TensorChunk]:
    for offset in range(0, raw.nbytes, chunk_bytes):
        yield pb.TensorChunk(name=name, offset=offset, data=bytes(raw[offset : offset + chunk_bytes]))


def tensor_header(name: str, tensor: Tensor) -> pb.TensorHeader:
    """What the receiver is told about ``tensor`` before any of its bytes arrive."""
    return encode(name, tensor)[0]


def tensor_chunks(name: str, tensor: Tensor, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[pb.TensorChunk]:
    """The tensor's bytes as chunks of at most ``chunk_bytes``; none for an empty tensor."""
    check_chunk_bytes(chunk_bytes)
    return _raw_chunks(name, _raw_bytes(name, tensor), chunk_bytes)


@dataclass
class _Slot:
    """A declared tensor being received."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    crc32: int
    buffer: bytearray | None = None  # allocated at the declared size on the first chunk
    received: int = 0
    running_crc: int = 0


class TensorAssembler:
    """Rebuilds the declared tensors from their chunks, trusting nothing the sender says.

    Headers are checked when the assembler is built (allowed dtype, non-negative shape,
    ``prod(shape) * itemsize == nbytes``, unique names, declared total at most
    ``max_total_bytes``); chunks as they arrive (declared name, offset continuing exactly
    where the tensor's previous chunk ended, no byte past the declared size); the CRC-32
    when a tensor completes; completeness in :meth:`finish`. Each tensor's bytes are held
    once, in a bytearray the returned tensor shares.
    """

    def __init__(self, headers: Iterable[pb.TensorHeader], *, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES) -> None:
        self._slots: dict[str, _Slot] = {}
        total = 0
        for header in headers:
            name = header.name
            if not name or name in self._slots:
                raise WireError("tensors.name", "expected a unique non-empty tensor name", name)
            if header.dtype not in DTYPES:
                message = f"expected one of {sorted(DTYPES)}, got {header.dtype!r}"
                raise WireError("tensors.dtype", message, name)
            dtype, shape = DTYPES[header.dtype], list(header.shape)
            if any(d < 0 for d in shape):
                raise WireError("tensors.shape", f"expected non-negative dimensions, got {shape}", name)
            expected = math.prod(shape) * dtype.itemsize
            if header.nbytes != expected:
                message = f"shape {shape} of {header.dtype} is {expected} bytes, header says {header.nbytes}"
                raise WireError("tensors.nbytes", message, name)
            total += expected
            if total > max_total_bytes:
                message = f"declared tensors total {total} bytes or more, over the limit of {max_total_bytes}"
                raise WireError("tensors.nbytes", message, name)
            if expected == 0 and header.crc32 != 0:
                message = f"an empty tensor has CRC-32 0, header says {header.crc32:#010x}"
                raise WireError("tensors.crc32", message, name)
            self._slots[name] = _Slot(dtype, tuple(shape), expected, header.crc32)
        self.total_bytes = total

    def add(self, chunk: pb.TensorChunk) -> None:
        """Copy one chunk into its tensor's buffer."""
        name, data = chunk.name, chunk.data
        slot = self._slots.get(name)
        if slot is None:
            raise WireError("chunk.name", "chunk for a tensor the header did not declare", name)
        if chunk.offset != slot.received:
            message = f"expected offset {slot.received} (chunks in order), got {chunk.offset}"
            raise WireError("chunk.offset", message, name)
        if not data:
            raise WireError("chunk.data", "expected a non-empty chunk", name)
        end = slot.received + len(data)
        if end > slot.nbytes:
            raise WireError("chunk.data", f"chunk ends at byte {end}, past the declared {slot.nbytes}", name)
        if slot.buffer is None:
            slot.buffer = bytearray(slot.nbytes)
        slot.buffer[slot.received : end] = data
        slot.running_crc = zlib.crc32(data, slot.running_crc)
        slot.received = end
        if end == slot.nbytes and slot.running_crc != slot.crc32:
            message = f"header says {slot.crc32:#010x}, the bytes give {slot.running_crc:#010x}"
            raise WireError("tensors.crc32", message, name)

    def finish(self) -> dict[str, Tensor]:
        """All declared tensors, in declaration order; raises if any is incomplete."""
        tensors = {}
        for name, slot in self._slots.items():
            if slot.received != slot.nbytes:
                message = f"stream ended after {slot.received} of {slot.nbytes} bytes"
                raise WireError("chunk.data", message, name)
            if slot.buffer is None:  # empty tensor: there are no bytes to share
                tensors[name] = torch.empty(slot.shape, dtype=slot.dtype)
            else:
                tensors[name] = torch.frombuffer(slot.buffer, dtype=slot.dtype).reshape(slot.shape)
        return tensors


# ----------------------------------------------------------------------------- streams


def tensor_stream(
    first: Message, encoded: list[tuple[pb.TensorHeader, memoryview]], chunk_bytes: int, wrap: type[Message]
) -> Iterator[Message]:
    """``first``, then every encoded tensor's chunks, each wrapped as ``wrap(chunk=...)``."""
    yield first
    for header, raw in encoded:
        for chunk in _raw_chunks(header.name, raw, chunk_bytes):
            yield wrap(chunk=chunk)


def open_stream(messages: Iterable[Message], first: str) -> tuple[Message, Iterator[Message]]:
    """The body of the stream's first message (a ``first``) and the rest of the stream."""
    stream = iter(messages)
    head = next(stream, None)
    kind = None if head is None else head.WhichOneof("kind")
    if kind != first:
        got = kind or "an empty stream"
        raise WireError(first, f"expected the stream to start with a {first}, got {got}")
    return getattr(head, first), stream


def receive(assembler: TensorAssembler, stream: Iterator[Message], first: str) -> dict[str, Tensor]:
    for message in stream:
        if message.WhichOneof("kind") != "chunk":
            raise WireError(first, f"expected one {first}, at the start of the stream; got another")
        assembler.add(message.chunk)
    return assembler.finish()
