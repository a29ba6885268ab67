"""Execution backends: run independent units of work in order, on threads, or over Dask.

Every backend maps a pure function over a list of inputs and returns the results *in input
order*, so the output of a run never depends on the backend or on how many partitions the
work was cut into. Noise is keyed by node (:mod:`censusdp.rng`): a task recomputed after a
worker failure draws exactly the same noise, which is what makes Dask's retry-on-failure safe
for a privacy release (Algorithm 4 of the subspace-DP paper: every agent privatizes locally
with the shared secret key).

``map`` returns values. ``submit`` returns *handles* instead, and the items of a later
``submit`` may contain handles (inside tuples, lists or dicts): on Dask the task then runs
where its inputs already are, and they never pass through the calling process. ``gather``
turns handles into values, ``wait`` blocks until they are computed and ``release`` drops
them. Without Dask a handle is its value.

Tasks carry confidential counts and the sub-keys of their noise (never the key itself: a Dask
task that would carry a :class:`~censusdp.rng.KeyedRNG` is refused). Whoever reads that
traffic can subtract the noise, so a Dask scheduler off this machine is joined only over TLS
(``tls://``, with a :class:`distributed.security.Security` built from CA, certificate and key
files: :func:`scheduler_security`); a plain ``tcp://`` address is accepted on the loopback
interface, and elsewhere only when the caller says it accepts plaintext traffic
(``allow_insecure_network``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import os
import types
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from censusdp.errors import ExecutionError, SpecError
from censusdp.executor import Executor
from censusdp.registry import Registry
from censusdp.rng import KeyedRNG

__all__ = [
    "Executor",
    "SyncExecutor",
    "ThreadExecutor",
    "DaskExecutor",
    "open_executor",
    "scheduler_security",
    "is_loopback",
    "SCHEDULERS",
    "KEEP_FREED_MEMORY",
    "keep_freed_memory",
    "ordered_ahead",
]


#: What a plaintext connection to another machine exposes (the start of every refusal).
_PLAINTEXT_RISK = (
    "Dask's tcp:// sends every task in plaintext: the partitions' confidential counts and the "
    "sub-keys of their noise, from which anyone on the network path can subtract the noise"
)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1, their IPv4-mapped
    forms). Names are not resolved: any other name counts as another machine."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _host(address: str) -> str:
    try:
        host = urlsplit(address).hostname
    except ValueError:
        host = None
    if not host:
        raise SpecError(f"scheduler address {address!r} has no host; expected tls://HOST:PORT")
    return host


def scheduler_security(
    address: str,
    *,
    tls_ca_file: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    allow_insecure_network: bool = False,
) -> Any:
    """The :class:`distributed.security.Security` to join the scheduler at ``address`` with,
    or None for a plaintext connection that is allowed.

    Parameters
    ----------
    address : str
        ``tls://HOST:PORT`` or ``tcp://HOST:PORT``.
    tls_ca_file, tls_cert, tls_key : path-like, optional
        The certificate authority that signed the cluster's certificates, and this client's
        certificate and private key (PEM). Unset ones come from Dask's configuration
        (``distributed.comm.tls.ca-file``, ``.client.cert``, ``.client.key``, e.g. the
        environment variables ``DASK_DISTRIBUTED__COMM__TLS__CA_FILE``,
        ``DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT``, ``..._CLIENT__KEY``).
    allow_insecure_network : bool
        Accept a plaintext ``tcp://`` scheduler on another machine.

    Raises
    ------
    SpecError
        A ``tcp://`` host other than the loopback without ``allow_insecure_network``; a
        ``tls://`` address without the three files, or with a file that does not exist; any
        other scheme. No connection is attempted.
    """
    scheme = address.split("://", 1)[0].lower() if "://" in address else ""
    if scheme == "tcp":
        host = _host(address)
        if is_loopback(host) or allow_insecure_network:
            return None
        raise SpecError(
            f"refusing the plaintext scheduler address {address!r}: {host!r} is not this "
            f"machine's loopback interface, and {_PLAINTEXT_RISK}. Use tls://{host}:PORT with "
            "[run] tls_ca_file, tls_cert and tls_key (the cluster's CA, this client's "
            "certificate and key), or, only on a network you trust end to end, set [run] "
            "allow_insecure_network = true"
        )
    if scheme != "tls":
        raise SpecError(
            f"scheduler address {address!r}: expected tls://HOST:PORT (or tcp:// on the "
            "loopback interface)"
        )
    _host(address)
    import dask
    import dask.distributed  # noqa: F401  (loads the distributed config)
    from distributed.security import Security

    given = {"tls_ca_file": tls_ca_file, "tls_cert": tls_cert, "tls_key": tls_key}
    config = {
        "tls_ca_file": "distributed.comm.tls.ca-file",
        "tls_cert": "distributed.comm.tls.client.cert",
        "tls_key": "distributed.comm.tls.client.key",
    }
    files = {k: v if v is not None else dask.config.get(config[k], None) for k, v in given.items()}
    missing = [k for k, v in files.items() if not v]
    if missing:
        raise SpecError(
            f"scheduler address {address!r} needs TLS files: set [run] {', '.join(missing)} "
            f"(or Dask's {', '.join(config[k] for k in missing)})"
        )
    for k, v in files.items():
        if not os.path.isfile(v):
            raise SpecError(f"[run] {k}: {os.fspath(v)!r} is not a file")
    return Security(
        tls_ca_file=os.fspath(files["tls_ca_file"]),
        tls_client_cert=os.fspath(files["tls_cert"]),
        tls_client_key=os.fspath(files["tls_key"]),
        require_encryption=True,
    )


def _check_no_key(fn: Callable[..., Any], args: Any, extra: tuple) -> None:
    """Refuse a Dask task that would carry a secret key (tasks get sub-keys only).

    The task's arguments are searched through containers (tuples, lists, dicts), dataclass
    fields, bound methods' objects, ``functools.partial`` arguments and the variables a
    function closes over, so a key cannot ride into a task inside a callable or a small
    record either.
    """
    seen: set[int] = set()

    def check(x: Any) -> None:
        if isinstance(x, KeyedRNG):
            raise TypeError(
                f"a Dask task ({getattr(fn, '__name__', fn)!r}) would receive a secret key; "
                "send it the sub-keys it draws from (KeyedRNG.restrict) instead"
            )
        if id(x) in seen:
            return
        if type(x) in (tuple, list):
            seen.add(id(x))
            for y in x:
                check(y)
        elif type(x) is dict:
            seen.add(id(x))
            for y in x.values():
                check(y)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            seen.add(id(x))
            for f in dataclasses.fields(x):
                check(getattr(x, f.name, None))
        elif isinstance(x, types.MethodType):
            check(x.__self__)
        elif isinstance(x, functools.partial):
            seen.add(id(x))
            check((x.func, x.args, x.keywords))
        elif isinstance(x, types.FunctionType):
            seen.add(id(x))
            cells = tuple(c.cell_contents for c in x.__closure__ or () if _filled(c))
            check((cells, x.__defaults__, x.__kwdefaults__))

    check(fn)
    check(args)
    check(extra)


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell (a variable not yet assigned)
        return False
    return True


class SyncExecutor(Executor):
    """Everything in the calling thread (the reference backend)."""

    name = "sync"
    workers = 1

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]:
        return [fn(item, *extra) for item in items]

    def close(self) -> None:
        """Nothing to release."""


class ThreadExecutor(Executor):
    """A thread pool: numpy and the solvers release the GIL in their heavy parts."""

    name = "threads"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="censusdp")

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]:
        return list(self._pool.map(lambda item: fn(item, *extra), items))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def ordered_ahead(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> Iterator[Any]:
    """``fn(item)`` for each item, yielded in order, with at most ``workers`` items computed
    ahead by a thread pool: a thread takes the next item as soon as it is free, not in groups
    of ``workers`` that each wait for their slowest (one worker: plain calls in this thread).
    """
    if workers <= 1:
        yield from (fn(item) for item in items)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


class _Handle:
    """A Dask future with the recipe that made it, so a lost or cancelled chain can be rebuilt.

    ``item`` may hold other handles (the inputs from earlier maps); they are replaced by their
    futures when the task is submitted, so the task runs where its inputs are.
    """

    __slots__ = ("fn", "item", "extra", "future")

    def __init__(self, fn: Callable[..., Any], item: Any, extra: tuple) -> None:
        self.fn, self.item, self.extra = fn, item, extra
        self.future: Any = None


def _walk(x: Any, leaf: Callable[[_Handle], Any]) -> Any:
    if isinstance(x, _Handle):
        return leaf(x)
    if type(x) in (tuple, list):
        return type(x)(_walk(y, leaf) for y in x)
    if type(x) is dict:
        return {k: _walk(v, leaf) for k, v in x.items()}
    return x


#: glibc ``malloc`` settings that keep the memory a process frees for its own reuse: never
#: trim the heap, serve arrays up to 1 GiB from it, grow it 64 MiB at a time. The stages
#: allocate and free the same large numpy temporaries again and again; memory given back to
#: the kernel has to be faulted in afresh, which on a VM costs about 20 µs per 4 KiB page
#: (measured on the 2-core CI machine: the national distributed benchmark ran 2× slower
#: under Dask's own ``MALLOC_TRIM_THRESHOLD_=65536``, which returns every freed block).
#: One arena: a thread's own arena is a heap of at most 64 MiB, so its larger arrays were
#: mapped and unmapped afresh each time whatever the thresholds (``pl94_national`` at 1/16
#: on two threads: 240.2 s with the three settings above, 195.9 s with one arena too).
KEEP_FREED_MEMORY = {
    "MALLOC_TRIM_THRESHOLD_": 1 << 34,
    "MALLOC_MMAP_THRESHOLD_": 1 << 30,
    "MALLOC_TOP_PAD_": 1 << 26,
    "MALLOC_ARENA_MAX": 1,
}


#: ``mallopt`` parameter numbers of :data:`KEEP_FREED_MEMORY`'s settings (glibc ``malloc.h``).
_MALLOPT = {
    "MALLOC_TRIM_THRESHOLD_": -1,
    "MALLOC_TOP_PAD_": -2,
    "MALLOC_MMAP_THRESHOLD_": -3,
    "MALLOC_ARENA_MAX": -8,
}


def keep_freed_memory() -> bool:
    """Give this process :data:`KEEP_FREED_MEMORY` through glibc's ``mallopt`` (what Dask
    workers get from their environment), for runs whose partitions are computed here (sync,
    threads). Returns False, changing nothing, where the C library is not glibc.

    Measured on the 2-core machine, same digests: ``pl94_national`` at 1/64 (sync) 103.0 s
    with the platform's policy, 87.9 s keeping freed memory; at 1/16 on two threads 252.5 s
    and 195.9 s. The peak grows with what the heap keeps (1/16: 5.0 → 6.4 GB). Call it
    before the threads that allocate start.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return all(libc.mallopt(_MALLOPT[k], v) == 1 for k, v in KEEP_FREED_MEMORY.items())
    except (OSError, AttributeError):
        return False


def _worker_environ(keep_memory: bool) -> dict:
    """Dask's pre-spawn environment of new workers, with :data:`KEEP_FREED_MEMORY`."""
    import dask

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}))
    if keep_memory:
        env.update({k: str(v) for k, v in KEEP_FREED_MEMORY.items()})
    return env


class DaskExecutor(Executor):
    """Dask distributed: a ``LocalCluster`` by default, or an existing scheduler address.

    Every task carries its item and the shared arguments (``extra``, meant to be small) in
    its own specification, and later tasks receive earlier results as futures; nothing is
    ``scatter``-ed, so the scheduler can recompute any result lost with a worker from its
    lineage. Tasks are submitted with ``pure=False`` and retried on worker loss; should Dask
    cancel a task instead, the whole chain of maps behind a ``gather`` is resubmitted (every
    task is a pure function of its inputs: keyed noise, per-node arithmetic).

    The worker processes of a ``LocalCluster`` started here keep the memory they free
    (:data:`KEEP_FREED_MEMORY`) unless ``keep_memory=False``; workers of an existing
    cluster run as their owner started them.

    An ``address`` is joined as :func:`scheduler_security` allows (TLS off the loopback;
    ``security`` overrides the files, ``allow_insecure_network`` accepts plaintext), and a
    cluster whose workers listen in plaintext on other machines is refused the same way:
    tasks carry confidential counts and noise sub-keys. A task never carries a
    :class:`~censusdp.rng.KeyedRNG`.
    """

    name = "distributed"

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        *,
        client: Any = None,
        keep_memory: bool = True,
        security: Any = None,
        tls_ca_file: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        allow_insecure_network: bool = False,
    ) -> None:
        import dask
        import dask.distributed  # noqa: F401  (loads the distributed config)
        from dask.distributed import Client, LocalCluster

        self._cluster = None
        self._owns_client = False
        if client is not None:
            self.client = client
        elif address:
            if security is None:
                security = scheduler_security(
                    address,
                    tls_ca_file=tls_ca_file,
                    tls_cert=tls_cert,
                    tls_key=tls_key,
                    allow_insecure_network=allow_insecure_network,
                )
            elif not address.lower().startswith("tls://"):
                scheduler_security(address, allow_insecure_network=allow_insecure_network)
            try:
                self.client = Client(address, timeout="20s", security=security)
            except OSError as exc:
                raise SpecError(
                    f"cannot reach the Dask scheduler at {address!r} ({exc}); start it or drop --scheduler"
                ) from None
            self._owns_client = True
        else:
            n = workers or min(2, os.cpu_count() or 1)
            environ = {"distributed.nanny.pre-spawn-environ": _worker_environ(keep_memory)}
            try:
                with dask.config.set(environ):  # read when the nannies are made
                    self._cluster = LocalCluster(
                        n_workers=n,
                        threads_per_worker=1,
                        processes=True,
                        dashboard_address=None,
                        # a dying worker is reported once, as censusdp's one-line error;
                        # CENSUSDP_DEBUG=1 keeps distributed's own error log
                        silence_logs=40 if os.environ.get("CENSUSDP_DEBUG") else 50,
                    )
            except (RuntimeError, TimeoutError) as exc:  # distributed: "Nanny failed to start."
                raise ExecutionError(
                    f"the local Dask cluster ({n} worker processes) could not start: a worker "
                    f"process died while starting ({type(exc).__name__}; killed, out of memory, "
                    "or a broken Python environment); nothing was written: rerun, or run with "
                    "--scheduler threads (or sync)"
                ) from None
            self.client = Client(self._cluster)
        workers = self.client.scheduler_info().get("workers", {})
        plain = [
            w
            for w in [getattr(self.client.scheduler, "address", ""), *workers]
            if str(w).lower().startswith("tcp://") and not is_loopback(_host(str(w)))
        ]
        if plain and not allow_insecure_network:
            self.close()
            raise SpecError(
                f"refusing the Dask cluster: {plain[0]!r} listens in plaintext off the loopback "
                f"interface, and {_PLAINTEXT_RISK}. Run the cluster with TLS (tls:// and "
                "certificates), or, only on a network you trust end to end, set [run] "
                "allow_insecure_network = true"
            )
        self.workers = len(workers) or 1

    #: Whole-chain resubmissions after the cluster lost or cancelled a task.
    attempts = 3

    def _launch(self, h: _Handle) -> Any:
        if h.future is None:
            args = _walk(h.item, self._launch)
            _check_no_key(h.fn, args, h.extra)
            with warnings.catch_warnings():
                # a task carries its partition's data on purpose (nothing is scattered, so
                # lineage can recompute it); Dask's advice to scatter large graphs does not apply
                warnings.filterwarnings("ignore", "Sending large graph", UserWarning)
                h.future = self.client.submit(h.fn, args, *h.extra, pure=False, retries=3)
        return h.future

    def _forget(self, h: _Handle) -> None:
        """Drop the futures of ``h`` and of every handle it was computed from."""
        if h.future is not None:
            h.future.release()
            h.future = None
        _walk(h.item, self._forget)

    def submit(
        self,
        fn: Callable[..., Any],
        items: Sequence[Any],
        *extra: Any,
        cost: Sequence[float] | None = None,
    ) -> list[_Handle]:
        handles = [_Handle(fn, item, extra) for item in items]
        # Dask queues tasks without inputs on the scheduler in submission order and hands
        # them out as worker threads free up: largest first balances the workers
        order = (
            range(len(handles)) if cost is None else np.argsort(-np.asarray(cost), kind="stable")
        )
        for i in order:
            self._launch(handles[i])
        return handles

    def each(self, handles: Sequence[_Handle]) -> Iterator[tuple[int, Any]]:
        """Results with their positions, each fetched as soon as it is ready (the transfers
        of early results overlap the computation of later ones)."""
        from dask.distributed import KilledWorker, as_completed
        from distributed.client import FutureCancelledError

        done: set[int] = set()
        for attempt in range(self.attempts):
            try:
                futures = [self._launch(h) for h in handles]
                index = {f.key: i for i, f in enumerate(futures)}
                pending = [f for i, f in enumerate(futures) if i not in done]
                # this client's loop: as_completed would otherwise run on the process's
                # default client, and a future awaited on two loops fails with "bound to a
                # different event loop" (seen with a second client in the process)
                for f in as_completed(pending, loop=self.client.loop):
                    i = index[f.key]
                    value = f.result()
                    done.add(i)
                    yield i, value
                return
            except (FutureCancelledError, KilledWorker):
                # a worker died and Dask dropped a task instead of recomputing it; every task
                # is a pure function of its inputs (keyed noise), so resubmitting the chain
                # gives exactly the same results
                if attempt == self.attempts - 1:
                    raise ExecutionError(
                        f"a Dask worker process died while computing ({self.attempts} tries, "
                        "each task retried on a fresh worker: killed, or out of memory); nothing "
                        "was written: rerun with more memory per worker or fewer workers, or "
                        "with --scheduler threads (or sync), which compute the same numbers"
                    ) from None
                for i, h in enumerate(handles):
                    if i not in done:
                        self._forget(h)

    def wait(self, handles: Sequence[_Handle]) -> None:
        """Block until the handles are computed (for timings); errors surface in ``gather``."""
        from dask.distributed import as_completed

        futures = [self._launch(h) for h in handles]
        for _ in as_completed(futures, loop=self.client.loop):  # not dask's wait(): it
            pass  # uses the process's default client, which may not be this one

    def release(self, handles: Sequence[_Handle]) -> None:
        """The caller needs these results no more (tasks depending on them keep them)."""
        for h in handles:
            if h.future is not None:
                h.future.release()
                h.future = None

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> list[Any]:
        handles = self.submit(fn, items, *extra)
        try:
            return self.gather(handles)
        finally:
            self.release(handles)

    def close(self) -> None:
        if self._cluster is not None or self._owns_client:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()


#: Every scheduler a spec or the command line can name: name → factory taking ``workers``,
#: ``address``, ``keep_memory`` and the network options of :func:`scheduler_security`.
SCHEDULERS: Registry[Callable[..., Executor]] = Registry("scheduler")
SCHEDULERS.add("sync", lambda workers, address, keep_memory, **network: SyncExecutor())
SCHEDULERS.add("threads", lambda workers, address, keep_memory, **network: ThreadExecutor(workers))
SCHEDULERS.add(
    "distributed",
    lambda workers, address, keep_memory, **network: DaskExecutor(
        address, workers, keep_memory=keep_memory, **network
    ),
)


@contextlib.contextmanager
def open_executor(
    scheduler: str = "sync",
    *,
    address: str | None = None,
    workers: int | None = None,
    keep_memory: bool = True,
    tls_ca_file: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    allow_insecure_network: bool = False,
) -> Iterator[Executor]:
    """Context manager yielding the executor for a scheduler name (one of
    :data:`SCHEDULERS`); an ``address`` (``tls://host:8786``, or ``tcp://`` on the loopback)
    joins an existing cluster, as does a ``scheduler`` given as an address. The TLS files and
    ``allow_insecure_network``: see :func:`scheduler_security`; ``keep_memory``: see
    :class:`DaskExecutor`."""
    if scheduler.lower().startswith(("tcp://", "tls://")):
        scheduler, address = "distributed", scheduler
    if scheduler not in SCHEDULERS:
        raise SpecError(SCHEDULERS.unknown(scheduler) + " (or give tcp://HOST:PORT)")
    ex = SCHEDULERS.get(scheduler)(
        workers,
        address,
        keep_memory,
        tls_ca_file=tls_ca_file,
        tls_cert=tls_cert,
        tls_key=tls_key,
        allow_insecure_network=allow_insecure_network,
    )
    try:
        yield ex
    finally:
        ex.close()
