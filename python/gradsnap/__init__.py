"""gradsnap: checkpoints of training state in a gradsnap-server or a local store, from Python.

    import gradsnap, numpy as np
    with gradsnap.connect(servers="127.0.0.1:7070", token=TOKEN) as c:   # or open_dir(path)
        c.save("job", 100, {"w": np.ones((4, 4), np.float32)})          # durable on return
        state = c.restore("job", "latest")                                # {"w": ndarray}

A thin layer over the C++ client library (include/gradsnap/client.h): tensors go in and out
through the buffer protocol without a copy on this side, and the GIL is released while the
library does I/O, so other threads keep running. ``gradsnap.torch`` holds the
torch.distributed.checkpoint plugin. docs/python.md has the whole reference.
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping, Optional, Sequence, Union

from . import _gradsnap
from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error,
                     FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange,
                     PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable,
                     Unimplemented)

__all__ = [
    "Client", "connect", "open_dir", "DTYPES",
    "Error", "Aborted", "AlreadyExists", "Cancelled", "DataLoss", "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange",
    "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable", "Unimplemented",
]

#: The element types a checkpoint stores, by gradsnap's name, with the NumPy dtype restore()
#: returns them as. bf16 has no NumPy type: it comes back as uint16 holding the bits (in torch:
#: ``torch.from_numpy(a).view(torch.bfloat16)``) and is saved from any 2-byte buffer with
#: ``dtypes={name: "bf16"}``.
DTYPES = {"f32": "float32", "bf16": "uint16", "f16": "float16", "f64": "float64",
          "i32": "int32", "i64": "int64", "u8": "uint8"}

Step = Union[int, str]


def _str_arg(name, value, allow_none=True):
    if value is None and allow_none:
        return ""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def _int_arg(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return value


def _step_arg(step):
    if isinstance(step, str):
        if step != "latest":
            raise ValueError(f'step must be an int or "latest", not {step!r}')
        return step
    return _int_arg("step", step)


def _bytes_arg(name, value):
    if isinstance(value, str):
        return value.encode()
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes or str, not {type(value).__name__}")
    return bytes(value)


class Client:
    """A connection to gradsnap-server nodes, or an embedded store in a local directory.

    Made by :func:`connect` or :func:`open_dir`. Thread-safe: several threads may save and
    restore at once (each call releases the GIL). A context manager; :meth:`close` (or leaving
    the ``with`` block) waits for every save of this client to end, then closes it. Calls on a
    closed client raise ``ValueError``.
    """

    def __init__(self, impl):
        self._c = impl

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Closes the client; further calls raise ValueError. Closing twice is fine."""
        self._c.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._c.closed

    def save(self, job: str, step: int, tensors: Mapping[str, object], rank: int = 0,
             world_size: int = 1, *, dtypes: Optional[Mapping[str, str]] = None,
             metadata: bytes = b"", checkpoint_metadata: bytes = b"") -> None:
        """Saves rank ``rank``'s shard of checkpoint (job, step) and returns once it is durable.

        ``tensors`` maps each tensor name ([A-Za-z0-9._-], at most 128 characters) to a
        C-contiguous buffer: a NumPy array, a CPU ``torch.Tensor``'s ``.numpy()``, a
        memoryview, bytes... Its element type comes from the buffer's format (float32, float64,
        float16, int32, int64, uint8); ``dtypes={name: "bf16"}`` (any name of DTYPES) overrides
        it, e.g. for bf16 bits in a uint16 array or raw bytes. The bytes are read where they
        lie (no copy here) and must not change until save returns. The checkpoint commits, and
        is listed, once all ``world_size`` ranks saved their shards; every rank passes the same
        world_size and checkpoint_metadata (opaque bytes, at most 1 MiB, stored with the
        checkpoint); ``metadata`` is this shard's own (at most 1 MiB).

        Raises InvalidArgument (bad name, step, rank or size), AlreadyExists (the rank or
        checkpoint was saved with a different spec), Unauthenticated / PermissionDenied,
        ResourceExhausted, Unavailable; TypeError for an unusable buffer or dtype.
        """
        job = _str_arg("job", job, allow_none=False)
        if not isinstance(tensors, Mapping):
            raise TypeError(f"tensors must be a mapping {{name: buffer}}, not "
                            f"{type(tensors).__name__}")
        self._c.save(job, _int_arg("step", step), dict(tensors), _int_arg("rank", rank),
                     _int_arg("world_size", world_size),
                     None if dtypes is None else dict(dtypes), _bytes_arg("metadata", metadata),
                     _bytes_arg("checkpoint_metadata", checkpoint_metadata))

    def restore(self, job: str, step: Step = "latest", rank: int = 0, *,
                out: Optional[Mapping[str, object]] = None,
                names: Optional[Iterable[str]] = None) -> dict:
        """Restores rank ``rank``'s tensors of a committed checkpoint, verified.

        ``step`` is a step number or ``"latest"`` (the newest committed one). Returns
        ``{name: array}`` in the shard's order: new NumPy arrays of each tensor's shape and
        dtype (see DTYPES), except for the names in ``out``, whose buffers (writable,
        C-contiguous, exactly the tensor's size in bytes) are filled in place, without a copy,
        and returned as given. ``names`` restores only those tensors.

        Raises NotFound (no such job, step, rank or tensor), FailedPrecondition (the
        checkpoint is not committed), DataLoss (the stored bytes are damaged), ValueError
        (an ``out`` buffer of the wrong size).
        """
        job = _str_arg("job", job, allow_none=False)
        if out is not None and not isinstance(out, Mapping):
            raise TypeError(f"out must be a mapping {{name: buffer}}, not {type(out).__name__}")
        if names is not None:
            names = [_str_arg("names[]", n, allow_none=False) for n in names]
        return self._c.restore(job, _step_arg(step), _int_arg("rank", rank),
                               None if out is None else dict(out), names)

    def read_range(self, job: str, step: int, rank: int, offset: int, length: int,
                   out=None):
        """Reads bytes [offset, offset + length) of a shard's payload (its tensors back to back
        in shard order) into ``out`` (a writable buffer of ``length`` bytes) or a new uint8
        array, which it returns. Every chunk touched is checked (DataLoss on damage); past the
        payload: OutOfRange."""
        job = _str_arg("job", job, allow_none=False)
        for n, v in (("step", step), ("rank", rank), ("offset", offset), ("length", length)):
            _int_arg(n, v)
        if offset < 0 or length < 0:
            raise ValueError("offset and length must be >= 0")
        return self._c.read_range(job, step, rank, offset, length, out)

    def read_ranges(self, job: str, step: int, rank: int, regions, *,
                    whole_shard: bool = False) -> None:
        """Fills several byte ranges of one shard's payload in one call: ``regions`` is a
        sequence of ``(offset, out)`` pairs, each ``out`` a writable C-contiguous buffer that
        receives payload bytes [offset, offset + its size); they may overlap and come in any
        order. With ``whole_shard=True`` the shard is read as one restore stream (as
        :meth:`restore`: every chunk checked and every tensor's digest), each piece copied
        into the regions it overlaps and the rest dropped: the fast way when the regions
        cover most of the shard. Else one ranged read of the span from the lowest offset to
        the highest end (as :meth:`read_range`), straight into ``out`` when a single region
        is given. DataLoss on damage; OutOfRange past the payload."""
        job = _str_arg("job", job, allow_none=False)
        for n, v in (("step", step), ("rank", rank)):
            _int_arg(n, v)
        if isinstance(regions, (str, bytes)) or not isinstance(regions, Iterable):
            raise TypeError("regions must be a sequence of (offset, out) pairs")
        regions = [tuple(r) if isinstance(r, (tuple, list)) else r for r in regions]
        self._c.read_ranges(job, step, rank, regions, bool(whole_shard))

    def list(self, job: str, pending: bool = False) -> list:
        """The checkpoints of ``job`` by ascending step, as dicts (job, step, kind, base_step,
        world_size, state, raw_bytes, stored_bytes, created_unix_ms, committed_unix_ms,
        metadata): committed ones, and pending ones too with ``pending=True``. An unknown job
        gives []."""
        return self._c.list(_str_arg("job", job, allow_none=False), bool(pending))

    def jobs(self) -> list:
        """Names of the jobs with at least one checkpoint, sorted."""
        return self._c.jobs()

    def show(self, job: str, step: Step = "latest") -> dict:
        """The manifest of one checkpoint: list()'s fields plus ``shards``, each a dict (rank,
        committed, raw_bytes, stored_bytes, metadata, tensors: [{name, dtype, shape,
        byte_length, digest, stored_bytes}]). NotFound: no such checkpoint."""
        return self._c.show(_str_arg("job", job, allow_none=False), _step_arg(step))

    def verify(self, job: str, step: Step = "latest") -> int:
        """Re-reads every chunk of every shard and checks checksums and SHA-256s; returns the
        step verified. DataLoss on damage, naming the shard and tensor."""
        return self._c.verify(_str_arg("job", job, allow_none=False), _step_arg(step))

    def delete(self, job: str, step: int) -> None:
        """Deletes one checkpoint and frees its space. NotFound: no such checkpoint;
        FailedPrecondition: a FULL that a DELTA is based on."""
        self._c.delete(_str_arg("job", job, allow_none=False), _int_arg("step", step))

    def abort(self, job: str, step: int) -> None:
        """Abandons a pending checkpoint (some of its ranks saved, not all) and frees its
        space, so the step can be saved anew. NotFound: no such checkpoint;
        FailedPrecondition: it is committed (use delete)."""
        self._c.abort(_str_arg("job", job, allow_none=False), _int_arg("step", step))

    def health(self) -> None:
        """Returns when every server answers (or the local store is open); Unavailable else."""
        self._c.health()


def connect(servers: Union[str, Sequence[str], None] = None, token: Optional[str] = None,
            tls_ca: Optional[str] = None, etcd: Optional[str] = None, *,
            tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
            replicas: Optional[int] = None, min_replicas: int = 2, timeout_ms: int = 30000,
            max_attempts: int = 8, read_streams: int = 1, etcd_ca: Optional[str] = None,
            etcd_cert: Optional[str] = None, etcd_key: Optional[str] = None,
            etcd_user: Optional[str] = None, etcd_password: Optional[str] = None) -> Client:
    """A client of gradsnap-server nodes: those listed in ``servers``, or, in cluster mode,
    the live nodes registered in the etcd at ``etcd`` (exactly one of the two).

    ``servers``: "host:port" or a list of them. ``etcd``: the etcd endpoints,
    "[http://]HOST:PORT[,...]": nodes, checkpoint catalog and job epochs come from etcd
    (docs/protocol.md, "Cluster mode"). ``token``: the job's bearer token
    (``gradsnap token JOB``); default none (the server runs open). ``tls_ca``: the PEM file of
    the servers' CA, which turns TLS on; ``tls_cert`` / ``tls_key`` add a client certificate
    (mutual TLS). ``replicas``: copies of each shard (default 1 with ``servers``, 3 in cluster
    mode, clamped there to the live nodes). ``min_replicas``: cluster mode, copies that must be
    durable for a save to succeed (default 2, clamped to the copies placed). ``timeout_ms``:
    deadline of each call (default 30000). ``max_attempts``: tries of a call that fails with
    UNAVAILABLE (default 8). ``read_streams``: streams per shard restore (default 1). With
    ``servers`` no RPC is made yet (:meth:`Client.health` checks the servers); with ``etcd``
    the client reads the live nodes from etcd before it returns (Unavailable when etcd does
    not answer).

    Towards etcd itself (cluster mode only; docs/deploy.md, "Cluster"): with https://
    ``etcd`` endpoints, ``etcd_ca`` is the PEM file of the CA etcd's certificates chain to
    (default: the system's roots) and ``etcd_cert`` / ``etcd_key`` a client certificate for
    etcd's --client-cert-auth; ``etcd_user`` logs in to an etcd with authentication on, with
    ``etcd_password`` (default: $GRADSNAP_ETCD_PASSWORD). Default: none of them.
    """
    if (servers is None) == (etcd is None):
        raise ValueError("pass exactly one of servers= (gradsnap-server addresses) and etcd= "
                         "(cluster mode)")
    if etcd is not None:
        etcd = _str_arg("etcd", etcd, allow_none=False)
        if not etcd:
            raise ValueError("etcd must not be empty")
        servers = []
    else:
        if isinstance(servers, str):
            servers = [servers]
        if not isinstance(servers, Sequence) or not servers:
            raise TypeError("servers must be \"host:port\" or a non-empty list of them")
        servers = [_str_arg("servers[]", s, allow_none=False) for s in servers]
    etcd_args = {"etcd_ca": etcd_ca, "etcd_cert": etcd_cert, "etcd_key": etcd_key,
                 "etcd_user": etcd_user, "etcd_password": etcd_password}
    for name, value in etcd_args.items():
        etcd_args[name] = _str_arg(name, value)
        if value is not None and etcd is None:
            raise ValueError(f"{name} applies to cluster mode only (etcd=)")
    if etcd_args["etcd_user"] and etcd_password is None:
        etcd_args["etcd_password"] = os.environ.get("GRADSNAP_ETCD_PASSWORD", "")
    if replicas is None:
        replicas = 3 if etcd else 1
    return Client(_gradsnap.open(
        servers, "", False, _str_arg("token", token), _str_arg("tls_ca", tls_ca),
        _str_arg("tls_cert", tls_cert), _str_arg("tls_key", tls_key),
        _int_arg("replicas", replicas), _int_arg("timeout_ms", timeout_ms),
        _int_arg("max_attempts", max_attempts), _int_arg("read_streams", read_streams),
        etcd or "", _int_arg("min_replicas", min_replicas), **etcd_args))


def open_dir(path: Union[str, os.PathLike], read_only: bool = False) -> Client:
    """A client of an embedded store in the local directory ``path`` (created if missing;
    one process at a time: FailedPrecondition when another has it open). ``read_only``:
    saves and deletes then fail with FailedPrecondition."""
    path = _str_arg("path", path, allow_none=False)
    if not path:
        raise ValueError("path must not be empty")
    return Client(_gradsnap.open([], path, bool(read_only), "", "", "", "", 1, 30000, 8, 1,
                                 "", 2))
