"""A storage plugin for torch.distributed.checkpoint (DCP): checkpoints of PyTorch state in
gradsnap (docs/python.md, "PyTorch").

    import torch.distributed.checkpoint as dcp
    import gradsnap, gradsnap.torch
    c = gradsnap.connect(servers="127.0.0.1:7070")
    dcp.save(state_dict, storage_writer=gradsnap.torch.Writer(c, "job", step))
    dcp.async_save(state_dict, storage_writer=gradsnap.torch.Writer(c, "job", step))
    dcp.load(state_dict, storage_reader=gradsnap.torch.Reader(c, "job", "latest"))

LAYOUT. A DCP save of W ranks is one gradsnap checkpoint (job, step) of world size W + 1.
Rank r's write items are gradsnap shard r: each item one tensor named "i<N>" holding its
bytes (a tensor's elements in row-major order, under the gradsnap dtype of its torch dtype, or
u8 for the others; a BytesIO item's bytes as u8). Shard W, written by DCP's coordinator in
finish() once every rank's shard is durable, holds one tensor "dcp.metadata": DCP's Metadata,
pickled, whose storage_data maps each item to its place (rank, byte offset and length in the
shard's payload, dtype and shape). The checkpoint commits, and is listed, only when all W + 1
shards are durable, so a save that dies part-way leaves nothing a Reader could pick up; its
checkpoint metadata is b'{"format":"torch.distributed.checkpoint"}'.

LOAD. A Reader reads the metadata shard, then, for each rank's shard its plan needs: when the
plan needs most of the shard (Reader's stream_fraction), the whole shard as one restore stream
whose pieces are copied straight into the target tensors (client.read_ranges, whole_shard);
else ranged reads of the bytes each item's requested region spans, small neighbouring items
merged into one read. Every chunk is checked against its checksum (gradsnap.DataLoss on
damage): loading with another world size, where DCP's planner asks for pieces of stored
tensors, reads only those pieces unless they are most of the shard.

Each rank uses its own Client. Async saves (dcp.async_save) run the writer on DCP's thread;
the GIL is released while the bytes move.
"""
from __future__ import annotations

import dataclasses
import io
import pickle
import uuid
from concurrent.futures import ThreadPoolExecutor

from typing import Any, Optional, Union

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,
                                                  SavePlanner, WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import Client

__all__ = ["Writer", "Reader", "ItemLocation", "CHECKPOINT_METADATA", "METADATA_TENSOR"]

#: The checkpoint metadata of every DCP checkpoint in gradsnap.
CHECKPOINT_METADATA = b'{"format":"torch.distributed.checkpoint"}'
#: The tensor of shard W (the last rank) that holds DCP's pickled Metadata.
METADATA_TENSOR = "dcp.metadata"

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
           torch.float64: "f64", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8"}


@dataclasses.dataclass(frozen=True)
class ItemLocation:
    """Where one DCP write item lies: bytes [offset, offset + length) of shard `rank`'s payload;
    a tensor item's dtype and shape (None for a BytesIO item)."""
    rank: int
    offset: int
    length: int
    dtype: Optional[torch.dtype] = None
    shape: Optional[tuple] = None


@dataclasses.dataclass(frozen=True)
class _RankPlan:
    rank: int
    world_size: int


def _check_client(client):
    if not isinstance(client, Client):
        raise TypeError(f"client must be a gradsnap.Client, not {type(client).__name__}")


#: Ranged reads: an item of at least this many bytes is read on its own, into its target.
_OWN_READ_BYTES = 1 << 20
#: Ranged reads: smaller items at most this far apart share one read ...
_MERGE_GAP_BYTES = 256 << 10
#: ... of at most this span.
_MERGE_SPAN_BYTES = 16 << 20


def _coalesce(regions):
    """Groups (offset, buffer) regions of one shard into ranged reads: each region of
    _OWN_READ_BYTES or more alone; the smaller ones, by offset, together while the gap to the
    next is at most _MERGE_GAP_BYTES and the group spans at most _MERGE_SPAN_BYTES."""
    groups, cur, cur_lo, cur_hi = [], [], 0, 0
    for off, buf in sorted(regions, key=lambda r: r[0]):
        if buf.nbytes >= _OWN_READ_BYTES:
            groups.append([(off, buf)])
            continue
        end = off + buf.nbytes
        if cur and off - cur_hi <= _MERGE_GAP_BYTES and \
                max(cur_hi, end) - cur_lo <= _MERGE_SPAN_BYTES:
            cur.append((off, buf))
            cur_hi = max(cur_hi, end)
            continue
        if cur:
            groups.append(cur)
        cur, cur_lo, cur_hi = [(off, buf)], off, end
    if cur:
        groups.append(cur)
    return groups


class Writer(StorageWriter):
    """Saves a DCP checkpoint as gradsnap checkpoint (job, step); see the module's LAYOUT.

    ``client``: this rank's gradsnap.Client. Every rank passes the same job and step. The step
    must not hold a committed checkpoint (gradsnap.AlreadyExists otherwise: a committed
    checkpoint is never overwritten); a pending one, left by a save that died, is abandoned
    (aborted) by the coordinator before any rank writes.
    """

    def __init__(self, client: Client, job: str, step: int):
        _check_client(client)
        if not isinstance(job, str):
            raise TypeError("job must be a str")
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError("step must be an int")
        self.client, self.job, self.step = client, job, step
        self.save_id = uuid.uuid4().hex

    def reset(self, checkpoint_id=None) -> None:
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # The coordinator, before any rank writes: a pending (job, step) left by a save that
        # died is abandoned, so its ranks' committed shards go (a re-save of other values
        # would fail with AlreadyExists: "committed with different content").
        for info in self.client.list(self.job, pending=True):
            if info["step"] == self.step and info["state"] == "pending":
                self.client.abort(self.job, self.step)
        return [dataclasses.replace(p, storage_data=_RankPlan(i, len(plans)))
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        rp: _RankPlan = plan.storage_data
        tensors, dtypes, results, keep = {}, {}, [], []
        offset = 0
        for n, item in enumerate(plan.items):
            data = planner.resolve_data(item)
            name = f"i{n}"
            if item.type == WriteItemType.BYTE_IO:
                buf = np.frombuffer(data.getbuffer(), dtype=np.uint8)
                loc = ItemLocation(rp.rank, offset, buf.nbytes)
                dtypes[name] = "u8"
            else:
                t = data.detach()
                if t.device.type != "cpu":
                    t = t.cpu()
                t = t.contiguous()
                keep.append(t)
                buf = t.reshape(-1).view(torch.uint8).numpy()
                loc = ItemLocation(rp.rank, offset, buf.nbytes, t.dtype, tuple(t.shape))
                dtypes[name] = _DTYPES.get(t.dtype, "u8")
            tensors[name] = buf
            offset += buf.nbytes
            results.append(WriteResult(index=item.index, size_in_bytes=loc.length,
                                       storage_data=loc))
        self.client.save(self.job, self.step, tensors, rank=rp.rank,
                         world_size=rp.world_size + 1, dtypes=dtypes,
                         checkpoint_metadata=CHECKPOINT_METADATA)
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        metadata.storage_meta = self.storage_meta()
        blob = pickle.dumps(metadata)
        self.client.save(self.job, self.step, {METADATA_TENSOR: blob}, rank=len(results),
                         world_size=len(results) + 1, checkpoint_metadata=CHECKPOINT_METADATA)

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=f"{self.job}:{self.step}", save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False


class Reader(StorageReader):
    """Loads the DCP checkpoint (job, step) from gradsnap; ``step`` is a number or "latest"
    (the newest committed DCP checkpoint of the job, resolved once, by the first
    read_metadata: pass a number when another save of the job may commit while ranks start
    loading). Any world size loads any checkpoint (DCP's planner reshards).

    ``stream_fraction`` (default 0.75): a rank's shard whose bytes this load needs at least
    this fraction of is read as one restore stream of the whole shard, each piece copied
    straight into the target tensors (Client.read_ranges with whole_shard=True; the bytes no
    item wants are dropped); 0 streams every shard the load touches, a value above 1 none.
    Shards needed less are read with ranged reads: one per item of 1 MiB or more (straight
    into its target), small items close together (gaps up to 256 KiB) in one read of up to
    16 MiB. ``read_threads`` (default 4): shard streams and ranged reads in flight at once."""

    def __init__(self, client: Client, job: str, step: Union[int, str] = "latest", *,
                 read_threads: int = 4, stream_fraction: float = 0.75):
        _check_client(client)
        if isinstance(read_threads, bool) or not isinstance(read_threads, int) or \
                read_threads < 1:
            raise ValueError("read_threads must be an int >= 1")
        if isinstance(stream_fraction, bool) or \
                not isinstance(stream_fraction, (int, float)) or not stream_fraction >= 0:
            raise ValueError("stream_fraction must be a number >= 0")
        self.read_threads = read_threads
        self.stream_fraction = float(stream_fraction)
        self._payload: dict = {}
        if not isinstance(job, str):
            raise TypeError("job must be a str")
        if not (step == "latest" or (isinstance(step, int) and not isinstance(step, bool))):
            raise TypeError('step must be an int or "latest"')
        self.client, self.job, self.step = client, job, step
        self.storage_data: dict = {}
        self.load_id = uuid.uuid4().hex

    def reset(self, checkpoint_id=None) -> None:
        self.storage_data = {}
        self._payload = {}
        self.load_id = uuid.uuid4().hex

    def _resolve_step(self) -> int:
        if self.step == "latest":
            # The newest committed checkpoint whose metadata says DCP. In cluster mode (etcd)
            # list() carries no checkpoint metadata (the etcd record keeps none): show() has it.
            for info in reversed(self.client.list(self.job)):
                md = info["metadata"] or self.client.show(self.job, info["step"])["metadata"]
                if md == CHECKPOINT_METADATA:
                    self.step = info["step"]
                    return self.step
            from . import NotFound
            raise NotFound(f"gradsnap: job {self.job} has no committed DCP checkpoint",
                           "NOT_FOUND")
        return self.step

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        step = self._resolve_step()
        info = self.client.show(self.job, step)
        if info["metadata"] != CHECKPOINT_METADATA:
            raise ValueError(f"gradsnap: {self.job} step {step} is not a DCP checkpoint")
        blob = self.client.restore(self.job, step, info["world_size"] - 1,
                                   names=[METADATA_TENSOR])[METADATA_TENSOR]
        metadata: Metadata = pickle.loads(blob.tobytes())
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data
        self._payload = {}  # rank -> payload bytes of its shard
        for loc in self.storage_data.values():
            self._payload[loc.rank] = max(self._payload.get(loc.rank, 0),
                                          loc.offset + loc.length)
        self._resolve_step()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        # Each item becomes a region (payload offset, buffer) of its rank's shard: the target
        # tensor's own bytes when the item is a whole stored tensor and the target is a
        # contiguous CPU tensor of its dtype (no copy), else a scratch buffer of the bytes the
        # region spans, copied into the target afterwards. Targets are resolved and committed
        # on this thread; the reads (GIL released) run on up to `read_threads` threads.
        regions: dict = {}  # rank -> [(offset, buffer)]
        after = []  # (item, target or None, buffer, strided view args or None)
        for item in plan.items:
            loc: ItemLocation = self.storage_data[item.storage_index]
            if item.type == LoadItemType.BYTE_IO:
                buf = np.empty(loc.length, np.uint8)
                regions.setdefault(loc.rank, []).append((loc.offset, buf))
                after.append((item, None, buf, None))
                continue
            target = planner.resolve_tensor(item).detach()
            offsets, lengths, shape = list(item.storage_offsets), list(item.lengths), \
                list(loc.shape)
            if any(n == 0 for n in lengths):
                after.append((item, target, None, None))
            elif (offsets == [0] * len(shape) and lengths == shape and
                  target.dtype == loc.dtype and target.is_contiguous() and
                  target.device.type == "cpu"):
                buf = target.reshape(-1).view(torch.uint8).numpy()
                regions.setdefault(loc.rank, []).append((loc.offset, buf))
                after.append((item, target, None, None))
            else:
                es = torch.empty((), dtype=loc.dtype).element_size()
                strides = [1] * len(shape)
                for d in range(len(shape) - 2, -1, -1):
                    strides[d] = strides[d + 1] * shape[d + 1]
                first = sum(o * s for o, s in zip(offsets, strides))
                last = sum((o + n - 1) * s for o, n, s in zip(offsets, lengths, strides))
                buf = np.empty((last - first + 1) * es, np.uint8)
                regions.setdefault(loc.rank, []).append((loc.offset + first * es, buf))
                after.append((item, target, buf, (loc.dtype, lengths, strides)))
        reads = []
        for rank, rs in regions.items():
            need = sum(b.nbytes for _, b in rs)
            if need >= self.stream_fraction * self._payload.get(rank, 0):
                reads.append((rank, rs, True))
            else:
                reads.extend((rank, group, False) for group in _coalesce(rs))
        # Largest first: a whole shard's stream starts before the small ranged reads.
        reads.sort(key=lambda r: -sum(b.nbytes for _, b in r[1]))

        def read(r):
            rank, rs, whole = r
            self.client.read_ranges(self.job, self.step, rank, rs, whole_shard=whole)

        with ThreadPoolExecutor(self.read_threads) as pool:
            for _ in pool.map(read, reads):
                pass
        for item, target, buf, strided in after:
            if target is None:
                planner.load_bytes(item, io.BytesIO(buf.tobytes()))
                continue
            if strided is not None:
                dtype, lengths, strides = strided
                flat = torch.from_numpy(buf).view(dtype)
                target.copy_(torch.as_strided(flat, lengths, strides))
            planner.commit_tensor(item, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False
