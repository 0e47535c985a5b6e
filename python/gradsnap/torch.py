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

LOAD. A Reader reads the metadata shard, then each item it needs with a ranged read of the
bytes the item's requested region spans (client.read_range), each chunk checked against its
checksum (gradsnap.DataLoss on damage): loading with another world size, where DCP's planner
asks for pieces of stored tensors, reads only those pieces.

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
    loading). Any world size loads any checkpoint (DCP's planner reshards). ``read_threads``:
    items read at once (default 4)."""

    def __init__(self, client: Client, job: str, step: Union[int, str] = "latest", *,
                 read_threads: int = 4):
        _check_client(client)
        if isinstance(read_threads, bool) or not isinstance(read_threads, int) or \
                read_threads < 1:
            raise ValueError("read_threads must be an int >= 1")
        self.read_threads = read_threads
        if not isinstance(job, str):
            raise TypeError("job must be a str")
        if not (step == "latest" or (isinstance(step, int) and not isinstance(step, bool))):
            raise TypeError('step must be an int or "latest"')
        self.client, self.job, self.step = client, job, step
        self.storage_data: dict = {}
        self.load_id = uuid.uuid4().hex

    def reset(self, checkpoint_id=None) -> None:
        self.storage_data = {}
        self.load_id = uuid.uuid4().hex

    def _resolve_step(self) -> int:
        if self.step == "latest":
            steps = [i["step"] for i in self.client.list(self.job)
                     if i["metadata"] == CHECKPOINT_METADATA]
            if not steps:
                from . import NotFound
                raise NotFound(f"gradsnap: job {self.job} has no committed DCP checkpoint",
                               "NOT_FOUND")
            self.step = steps[-1]
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
        self._resolve_step()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _read(self, loc: ItemLocation, offset: int, length: int, out=None):
        return self.client.read_range(self.job, self.step, loc.rank, loc.offset + offset, length,
                                      out)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        # Targets are resolved and committed on this thread; the reads (GIL released) run on
        # up to `read_threads` threads at once.
        jobs = []
        for item in plan.items:
            loc: ItemLocation = self.storage_data[item.storage_index]
            target = (None if item.type == LoadItemType.BYTE_IO
                      else planner.resolve_tensor(item).detach())
            jobs.append((item, loc, target))

        def read(job):
            item, loc, target = job
            if target is None:
                return self._read(loc, 0, loc.length)
            self._read_region(loc, item.storage_offsets, item.lengths, target)
            return None

        with ThreadPoolExecutor(self.read_threads) as pool:
            for (item, loc, target), data in zip(jobs, pool.map(read, jobs)):
                if target is None:
                    planner.load_bytes(item, io.BytesIO(data.tobytes()))
                else:
                    planner.commit_tensor(item, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_region(self, loc: ItemLocation, offsets, lengths, target: torch.Tensor) -> None:
        """Fills `target` with the sub-tensor [offsets, offsets + lengths) of a stored tensor:
        one ranged read of the bytes from its first element to its last (row-major), straight
        into `target` when the region is the whole tensor and `target` is contiguous."""
        shape = list(loc.shape)
        lengths = list(lengths)
        if any(n == 0 for n in lengths):
            return
        if (list(offsets) == [0] * len(shape) and lengths == shape and
                target.dtype == loc.dtype and target.is_contiguous() and
                target.device.type == "cpu"):
            self._read(loc, 0, loc.length, target.reshape(-1).view(torch.uint8).numpy())
            return
        es = torch.empty((), dtype=loc.dtype).element_size()
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        first = sum(o * s for o, s in zip(offsets, strides))
        last = sum((o + n - 1) * s for o, n, s in zip(offsets, lengths, strides))
        raw = self._read(loc, first * es, (last - first + 1) * es)
        flat = torch.from_numpy(raw).view(loc.dtype)
        target.copy_(torch.as_strided(flat, lengths, strides))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False
