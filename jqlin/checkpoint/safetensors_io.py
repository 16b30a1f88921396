"""Safetensors I/O shared by every checkpoint ecosystem: a lazy, checked reader and a streaming writer.

Reading: a checkpoint directory holds `model.safetensors` or shards listed in
`model.safetensors.index.json`. Each file is opened with `safetensors.safe_open`, whose parser is
the authority on header validity (malformed JSON, overlapping or uncovered byte ranges); the
header is also parsed here, first, so that a truncated file is reported with the tensor whose
bytes are missing. Tensors are read one at a time at the header's byte offsets and viewed
through ml_dtypes: safetensors 0.8's numpy/flax backends cannot materialize float8 tensors
(they look `float8_e4m3fn` up on the numpy module, which has none), while the byte layout of
every dtype is fixed by the format.

Writing: `ShardWriter` streams tensors into safetensors files without holding more than one
tensor in memory: data goes to a body file as it arrives, and when a shard is closed its
header (which must precede the data) is written followed by the body.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
import struct

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

from ..errors import CheckpointError

__all__ = ["TensorInfo", "TensorStore", "ShardWriter", "DTYPES", "tag_of", "SINGLE_FILE",
           "INDEX_FILE"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype tag -> numpy dtype (ml_dtypes for the narrow floats)
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8), "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_TAGS = {dt: tag for tag, dt in DTYPES.items()}
# HF shard names: model-00001-of-00004.safetensors
_SHARD = re.compile(r"(?P<set>.+)-\d+-of-(?P<n>\d+)\.safetensors")


def tag_of(dtype) -> str:
    """safetensors tag of a numpy/ml_dtypes dtype."""
    try:
        return _TAGS[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise CheckpointError(f"dtype {dtype} cannot be stored in safetensors") from None


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors tag, e.g. "F8_E4M3"
    shape: tuple[int, ...]
    file: pathlib.Path
    begin: int  # absolute byte offset in the file
    nbytes: int

    @property
    def where(self) -> str:
        return f"{self.file.name}: tensor '{self.name}'"


def _read_header(path: pathlib.Path) -> tuple[dict, dict[str, TensorInfo]]:
    """Parse and check one file's header; returns (metadata, infos). Errors name the tensor."""
    try:
        return _parse_header(path)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from None


def _parse_header(path: pathlib.Path) -> tuple[dict, dict[str, TensorInfo]]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: not a safetensors file ({size} bytes, truncated header)")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > size - 8:
            raise CheckpointError(
                f"{path}: header length {hlen} exceeds the file size {size}: truncated or not safetensors")
        raw = f.read(hlen)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header (invalid JSON: {e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    base = 8 + hlen
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        where = f"{path.name}: tensor '{name}'"
        try:
            tag, shape, (b, e) = entry["dtype"], entry["shape"], entry["data_offsets"]
            shape = tuple(int(d) for d in shape)
            b, e = int(b), int(e)
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{where}: malformed header entry {entry!r}") from None
        if tag not in DTYPES:
            raise CheckpointError(
                f"{where}: unsupported dtype {tag!r} (supported: {', '.join(DTYPES)})")
        expected = math.prod(shape) * DTYPES[tag].itemsize
        if min(shape, default=1) < 0 or e - b != expected:
            raise CheckpointError(
                f"{where}: header says {tag}{list(shape)} ({expected} bytes) but its data offsets "
                f"[{b}, {e}) span {e - b} bytes")
        if base + e > size:
            raise CheckpointError(
                f"{where}: data ends at byte {base + e} but the file has {size} bytes: the file "
                "is truncated")
        infos[name] = TensorInfo(name, tag, shape, path, base + b, e - b)
    try:  # the reference parser: overlaps, gaps, trailing bytes
        with safe_open(path, framework="numpy") as f:
            f.keys()
    except SafetensorError as e:
        raise CheckpointError(f"{path}: corrupt safetensors file: {e}") from None
    return meta, infos


class TensorStore:
    """The tensors of a checkpoint directory (one file or an index of shards), read lazily.

    `problems` (file name -> why) holds what makes the directory doubtful without making its
    tensors unreadable, e.g. a shard file the index does not list; the loader raises them and
    `inspect` lists them beside the layer table.
    """

    def __init__(self, path: str | os.PathLike):
        """`path`: a checkpoint directory, or one .safetensors file."""
        path = pathlib.Path(path)
        self._infos: dict[str, TensorInfo] = {}
        self.metadata: dict[str, dict] = {}
        self.problems: dict[str, str] = {}
        if path.is_file():
            self.directory, single, index = path.parent, path, None
        else:
            self.directory, single, index = path, path / SINGLE_FILE, path / INDEX_FILE
        if index is not None and index.is_file():
            self._open_index(index)
        elif single.is_file():
            meta, infos = _read_header(single)
            self.metadata[single.name] = meta
            self._infos = infos
        else:
            others = sorted(p.name for p in self.directory.glob("*.safetensors"))
            hint = f" (found {', '.join(others)} but no index)" if others else ""
            raise CheckpointError(
                f"{self.directory}: expected {SINGLE_FILE} or {INDEX_FILE}{hint}")

    def _open_index(self, index: pathlib.Path) -> None:
        try:
            data = json.loads(index.read_text())
            weight_map = data["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index}: invalid JSON: {e}") from None
        except (KeyError, TypeError):
            raise CheckpointError(f"{index}: expected an object with a 'weight_map' of "
                                  "tensor name -> file name") from None
        if not weight_map:
            raise CheckpointError(f"{index}: 'weight_map' is empty: the index lists no tensors "
                                  "(regenerate it from the shards)")
        by_file: dict[str, list[str]] = {}
        for name, fname in weight_map.items():
            by_file.setdefault(str(fname), []).append(name)
        for fname, names in sorted(by_file.items()):
            path = self.directory / fname
            if pathlib.Path(fname).name != fname:
                raise CheckpointError(f"{index}: shard '{fname}' must be a file name in the directory")
            if not path.is_file():
                raise CheckpointError(
                    f"{index}: shard '{fname}' (holding tensor '{names[0]}') does not exist")
            meta, infos = _read_header(path)
            self.metadata[fname] = meta
            for name in names:
                if name not in infos:
                    raise CheckpointError(
                        f"{index}: tensor '{name}' is mapped to '{fname}', which does not contain it")
            extra = sorted(set(infos) - set(names))
            if extra:
                raise CheckpointError(
                    f"{fname}: tensor '{extra[0]}' is in the file but not in {INDEX_FILE}")
            for name in names:
                self._infos[name] = infos[name]
        self._check_unlisted_shards(index, set(by_file))

    def _check_unlisted_shards(self, index: pathlib.Path, listed: set[str]) -> None:
        """A file of a listed shard set (same `<name>-of-<N>`) that the index does not list: its
        tensors, often whole layers, would be silently left out. (The index's
        metadata.total_size is not compared: writers compute it differently -- torch storage
        sizes, shared tensors counted once -- and some omit or hand-write it.)"""
        sets = {(m["set"], m["n"]) for f in listed if (m := _SHARD.fullmatch(f))}
        for p in sorted(self.directory.glob("*.safetensors")):
            m = _SHARD.fullmatch(p.name)
            if m and (m["set"], m["n"]) in sets and p.name not in listed:
                self.problems[p.name] = (
                    f"{index}: shard file '{p.name}' is in the directory and belongs to the "
                    f"index's '{m['set']}-*-of-{m['n']}' shard set, but the index maps no tensor "
                    "to it: its tensors would be left out (regenerate the index, or remove the "
                    "stray file)")

    # -- queries ------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._infos)

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def __len__(self) -> int:
        return len(self._infos)

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise CheckpointError(f"{self.directory}: missing tensor '{name}'") from None

    def read(self, name: str) -> np.ndarray:
        """One tensor as a fresh numpy array of its stored dtype (bf16/fp8 via ml_dtypes)."""
        info = self.info(name)
        try:
            with open(info.file, "rb") as f:
                f.seek(info.begin)
                buf = np.fromfile(f, dtype=np.uint8, count=info.nbytes)
        except OSError as e:
            raise CheckpointError(f"{info.where}: cannot read: {e.strerror or e}") from None
        if buf.size != info.nbytes:  # the file changed since its header was checked
            raise CheckpointError(f"{info.where}: short read ({buf.size} of {info.nbytes} bytes)")
        return buf.view(DTYPES[info.dtype]).reshape(info.shape)

    @property
    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self._infos.values())


class ShardWriter:
    """Streams tensors into safetensors shards in `directory`; one tensor in memory at a time.

    Shards roll over at `max_shard_bytes`; with more than one shard an HF-style
    `model.safetensors.index.json` is written, so any safetensors reader can open the result.
    """

    def __init__(self, directory: str | os.PathLike, *, max_shard_bytes: int = 4 << 30,
                 metadata: dict[str, str] | None = None):
        self.directory = pathlib.Path(directory)
        self.max_shard_bytes = int(max_shard_bytes)
        self.metadata = dict(metadata or {})
        self._shards: list[tuple[str, dict]] = []  # (temporary name, header)
        self._names: set[str] = set()
        self._body = None
        self._header: dict = {}
        self._offset = 0
        self.bytes_written = 0

    def _open_shard(self) -> None:
        idx = len(self._shards)
        self._body_path = self.directory / f".shard{idx:05d}.body"
        self._body = open(self._body_path, "wb")
        self._header, self._offset = {}, 0

    def _close_shard(self) -> None:
        if self._body is None:
            return
        self._body.close()
        tmp = f".shard{len(self._shards):05d}.safetensors"
        header = dict(self._header)
        if self.metadata:
            header["__metadata__"] = self.metadata
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the format allows space padding; keeps data 8-aligned
        with open(self.directory / tmp, "wb") as out, open(self._body_path, "rb") as body:
            out.write(struct.pack("<Q", len(raw)))
            out.write(raw)
            shutil.copyfileobj(body, out, 1 << 20)
        self._body_path.unlink()
        self._shards.append((tmp, header))
        self._body = None

    def write(self, name: str, array) -> None:
        if name in self._names:
            raise CheckpointError(f"tensor '{name}' written twice")
        arr = np.asarray(array)
        if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            arr = arr.copy(order="C")
        tag = tag_of(arr.dtype)
        if self._body is not None and self._offset and self._offset + arr.nbytes > self.max_shard_bytes:
            self._close_shard()
        if self._body is None:
            self._open_shard()
        self._body.write(arr.reshape(-1).view(np.uint8))  # no intermediate bytes copy
        self._header[name] = {"dtype": tag, "shape": list(arr.shape),
                              "data_offsets": [self._offset, self._offset + arr.nbytes]}
        self._offset += arr.nbytes
        self._names.add(name)
        self.bytes_written += arr.nbytes

    def close(self) -> list[str]:
        """Finish the last shard, give shards their final names; returns the file names."""
        self._close_shard()
        if not self._shards:
            self._open_shard()
            self._close_shard()
        n = len(self._shards)
        final = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors"
                                              for i in range(n)]
        for (tmp, _), name in zip(self._shards, final):
            os.replace(self.directory / tmp, self.directory / name)
        if n > 1:
            weight_map = {t: name for (_, h), name in zip(self._shards, final)
                          for t in h if t != "__metadata__"}
            index = {"metadata": {"total_size": self.bytes_written}, "weight_map": weight_map}
            (self.directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))
        return final

    def abort(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

