# Type stubs of the package gradsnap (docs/python.md). The exceptions are in errors.py.
import os
from typing import Any, Iterable, Mapping, Optional, Sequence, TypedDict, Union

from .errors import (Aborted as Aborted, AlreadyExists as AlreadyExists,
                     Cancelled as Cancelled, DataLoss as DataLoss,
                     DeadlineExceeded as DeadlineExceeded, Error as Error,
                     FailedPrecondition as FailedPrecondition, Internal as Internal,
                     InvalidArgument as InvalidArgument, NotFound as NotFound,
                     OutOfRange as OutOfRange, PermissionDenied as PermissionDenied,
                     ResourceExhausted as ResourceExhausted, Unauthenticated as Unauthenticated,
                     Unavailable as Unavailable, Unimplemented as Unimplemented)

Step = Union[int, str]  # a step number or "latest"
DTYPES: dict[str, str]

class CheckpointInfo(TypedDict):
    job: str
    step: int
    kind: str          # "full" or "delta"
    base_step: int
    world_size: int
    state: str         # "committed" or "pending"
    raw_bytes: int
    stored_bytes: int
    created_unix_ms: int
    committed_unix_ms: int
    metadata: bytes

class TensorInfo(TypedDict):
    name: str
    dtype: str         # a key of DTYPES
    shape: tuple[int, ...]
    byte_length: int
    digest: str
    stored_bytes: int

class ShardInfo(TypedDict):
    rank: int
    committed: bool
    raw_bytes: int
    stored_bytes: int
    metadata: bytes
    tensors: list[TensorInfo]

class Manifest(CheckpointInfo):
    shards: list[ShardInfo]

class Client:
    def __enter__(self) -> Client: ...
    def __exit__(self, *exc: Any) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def save(self, job: str, step: int, tensors: Mapping[str, Any], rank: int = ...,
             world_size: int = ..., *, dtypes: Optional[Mapping[str, str]] = ...,
             metadata: bytes = ..., checkpoint_metadata: bytes = ...) -> None: ...
    def restore(self, job: str, step: Step = ..., rank: int = ..., *,
                out: Optional[Mapping[str, Any]] = ...,
                names: Optional[Iterable[str]] = ...) -> dict[str, Any]: ...
    def read_range(self, job: str, step: int, rank: int, offset: int, length: int,
                   out: Any = ...) -> Any: ...
    def read_ranges(self, job: str, step: int, rank: int,
                    regions: Iterable[tuple[int, Any]], *,
                    whole_shard: bool = ...) -> None: ...
    def list(self, job: str, pending: bool = ...) -> list[CheckpointInfo]: ...
    def jobs(self) -> list[str]: ...
    def show(self, job: str, step: Step = ...) -> Manifest: ...
    def verify(self, job: str, step: Step = ...) -> int: ...
    def delete(self, job: str, step: int) -> None: ...
    def abort(self, job: str, step: int) -> None: ...
    def health(self) -> None: ...

def connect(servers: Union[str, Sequence[str], None] = ..., token: Optional[str] = ...,
            tls_ca: Optional[str] = ..., etcd: Optional[str] = ..., *,
            tls_cert: Optional[str] = ..., tls_key: Optional[str] = ...,
            replicas: Optional[int] = ..., min_replicas: int = ..., timeout_ms: int = ...,
            max_attempts: int = ..., read_streams: int = ..., etcd_ca: Optional[str] = ...,
            etcd_cert: Optional[str] = ..., etcd_key: Optional[str] = ...,
            etcd_user: Optional[str] = ..., etcd_password: Optional[str] = ...) -> Client: ...
def open_dir(path: Union[str, os.PathLike[str]], read_only: bool = ...) -> Client: ...
