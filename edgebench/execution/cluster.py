"""Multi-host labs on Dask distributed.

`edgebench worker --scheduler tcp://H:P --lab DIR` runs a Dask worker that advertises each device of its lab
as the resource `device:<name>=1` (the host itself, `local` or any local-transport descriptor, only when
named with `--device`: every worker has a host, few should lend it out). `edgebench run SUITE --cluster
tcp://H:P` sends every job as a task that needs its device's resource, so it runs on a host that holds the
device, one task per device at a time. The task drives the device with the same `LocalSession` a local run
uses (lease, health check, retries, cool-down) and hands back the JobOutcome; the controller stores it in
its own store.

Model files travel once per worker: the controller scatters their bytes, the worker keeps them in a
content-addressed folder under its cache.

A worker lost mid-job: the job goes to another worker holding the device, if any; if no worker holds
the device for the suite's `worker_grace` (policy), the controller turns the job into an error record and
moves on.
A worker's session (and device lease) stays open between one run's jobs and is released when the
controller says the device's series is over, or after `idle_release_s` without a job. So a device's jobs
stay on the worker that opened its session: when two workers share a device, the other one would only wait
for that lease. A worker whose scheduler goes away stops with an error (exit 3), so its supervisor restarts
it; only SIGTERM / SIGINT stop it cleanly.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from distributed import WorkerPlugin

from ..descriptors import Lab, load_lab
from ..errors import LabError, UserError, one_line
from ..jobs import Job, JobOutcome, ModelRef
from ..lab.hashing import HashCache
from .execute import error_kind
from .leases import DEFAULT_LEASE_S, DeviceLease, LeaseTimeout, lease_key
from .session import DeviceReady, LocalSession, StateFn, error_outcome, prebuild_agent
from .suite import PATH_PARAMS, RunPolicy

PLUGIN_NAME = "edgebench"
RESOURCE_PREFIX = "device:"
POLL_S = 1.0
GATHER_TIMEOUT_S = 60.0  # fetching a finished task's result (an outcome: kilobytes) from its worker
BUSY_RETRY_S = 1.0
MAX_LOSSES = 3  # a job lost with its worker is submitted again this many times
IDLE_RELEASE_S = 60.0
# On a worker, a session of another run holding the device must not block the task (and the Dask
# resource with it): the task reports "busy" after this wait and the controller submits it again.
WORKER_LEASE_WAIT_S = 2.0


def resource_name(device: str) -> str:
    return f"{RESOURCE_PREFIX}{device}"


# ---- worker side --------------------------------------------------------------------------------
@dataclass
class _Slot:
    session: LocalSession
    ready: DeviceReady
    last_used: float
    busy: int = 0


class DeviceService(WorkerPlugin):
    """The worker's devices: one open session per (run, device), reused across that run's jobs."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(
        self,
        lab: Lab,
        devices: Sequence[str],
        *,
        lock_dir: Path | None = None,
        idle_release_s: float = IDLE_RELEASE_S,
        lease_s: float = DEFAULT_LEASE_S,
        files_dir: Path | None = None,
    ) -> None:
        self.lab = lab
        self.devices = tuple(devices)
        self.lock_dir = lock_dir
        self.idle_release_s = idle_release_s
        self.lease_s = lease_s
        self.files_dir = files_dir or _default_files_dir()
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._lock = threading.Lock()
        self._device_locks = {d: threading.Lock() for d in self.devices}
        self._leases = {
            d: DeviceLease(d, key=lease_key(lab.get(d)), folder=lock_dir, lease_s=lease_s)
            for d in self.devices
        }
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    # WorkerPlugin hooks
    def setup(self, worker: Any = None) -> None:
        prebuild_agent()  # before device tasks start in parallel threads
        self._reaper = threading.Thread(target=self._reap_idle, name="edgebench-reaper", daemon=True)
        self._reaper.start()

    def teardown(self, worker: Any = None) -> None:
        self._stop.set()
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
        for slot in slots:
            slot.session.close()

    # tasks call these
    def acquire(self, run_id: str, device: str, policy: RunPolicy) -> _Slot | str:
        """The open session for (run, device), created (lease, health check) when missing.

        Returns the holder's description instead when another run holds the device's lease.
        """
        if device not in self._device_locks:
            raise LabError(f"this worker does not hold device '{device}'")
        with self._device_locks[device]:
            with self._lock:
                slot = self._slots.get((run_id, device))
                other = next((r for r, d in self._slots if d == device and r != run_id), None)
            if slot is None and other is not None:
                # Another run's session on this worker holds the device (and its lease): queue behind it.
                return f"run {other} on worker {_worker_address()}"
            if slot is not None and not slot.session.lease.lost:
                slot.busy += 1
                return slot
            if slot is not None:
                self.release(run_id, device)
            worker_policy = replace(policy, lease_timeout_s=WORKER_LEASE_WAIT_S)
            session = LocalSession(self.lab.get(device), run_id, worker_policy, lease=self._leases[device])
            try:
                ready = session.prepare(lambda state, detail: None)
            except LeaseTimeout as exc:
                session.close()
                return one_line(exc)
            except BaseException:
                session.close()
                raise
            slot = _Slot(session, ready, time.monotonic(), busy=1)
            with self._lock:
                self._slots[(run_id, device)] = slot
            return slot

    def done_with(self, slot: _Slot) -> None:
        slot.busy -= 1
        slot.last_used = time.monotonic()

    def release(self, run_id: str, device: str) -> bool:
        with self._lock:
            slot = self._slots.pop((run_id, device), None)
        if slot is not None:
            slot.session.close()
        return slot is not None

    def missing_files(self, files: dict[str, HostFile]) -> list[str]:
        """Which of the job's host files this worker has no copy of yet."""
        return [path for path, f in files.items() if not self._has(self._cached(f.folder, path), f.size)]

    def store_files(self, files: dict[str, HostFile], payload: dict[str, bytes]) -> None:
        """Keep shipped files in the content-addressed folder, checked against the controller's hash."""
        for path, data in payload.items():
            sha, folder = files[path].sha256, files[path].folder
            if hashlib.sha256(data).hexdigest() != sha:
                raise LabError(f"{Path(path).name}: shipped file does not match its sha256 {sha}")
            dest = self._cached(folder, path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_bytes(data)
            os.replace(tmp, dest)

    def local_job(self, job: Job, files: dict[str, HostFile]) -> Job:
        """The controller's job with its host files replaced by this worker's copies."""
        local = {path: self._cached(f.folder, path) for path, f in files.items()}
        model = job.model
        if model is not None and str(model.path) in local:
            model = ModelRef(model.name, local[str(model.path)])
        params = dict(job.params)
        for key in PATH_PARAMS:
            value = params.get(key)
            if isinstance(value, str) and value in local:
                params[key] = str(local[value])
        return replace(job, model=model, params=params)

    def _cached(self, folder: str, path: str) -> Path:
        # Keep the file's own name: records show an inputs file by name, converters key on the stem, and
        # a model's files find each other by name in their common folder.
        return self.files_dir / folder / Path(path).name

    @staticmethod
    def _has(path: Path, size: int) -> bool:
        try:
            return path.stat().st_size == size
        except OSError:
            return False

    def _reap_idle(self) -> None:
        while not self._stop.wait(min(5.0, self.idle_release_s / 2)):
            now = time.monotonic()
            with self._lock:
                idle = [
                    k
                    for k, s in self._slots.items()
                    if not s.busy and now - s.last_used > self.idle_release_s
                ]
            for run_id, device in idle:
                self.release(run_id, device)


class HostFile(NamedTuple):
    """A host file a job needs: its content, its size, and the folder a worker keeps it in (its own hash,
    or for a model in several files the hash of all of them, so they stay side by side)."""

    sha256: str
    size: int
    folder: str


def host_files(job: Job, hashes: HashCache) -> dict[str, HostFile]:
    """The host files a job reads (its model's, the files its params name), by path. A model's files (an
    ncnn graph and its weights) share the folder their common content names."""
    model = [str(p) for p in job.model.files] if job.model is not None else []
    paths = list(model)
    for key in PATH_PARAMS:
        value = job.params.get(key)
        if isinstance(value, str) and Path(value).is_file():
            paths.append(value)
    together = hashes.content([Path(p) for p in model]) if len(model) > 1 else None
    out = {}
    for p in paths:
        sha = hashes.sha256(Path(p))
        out[p] = HostFile(sha, Path(p).stat().st_size, together if together and p in model else sha)
    return out


def _default_files_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgebench" / "cluster-files"


def _service() -> DeviceService:
    from distributed import get_worker

    service = get_worker().plugins[PLUGIN_NAME]
    assert isinstance(service, DeviceService)
    return service


def _worker_address() -> str:
    from distributed import get_worker

    try:
        return str(get_worker().address)
    except ValueError:  # not inside a Dask task
        return "this worker"


def prepare_task(run_id: str, device: str, policy: RunPolicy) -> dict[str, Any]:
    """Dask task: open the device's session on this worker; failures and a busy device come back as data."""
    try:
        got = _service().acquire(run_id, device, policy)
    except Exception as exc:  # noqa: BLE001 - failures are data for the controller
        return {
            "status": "error",
            "error": one_line(exc),
            "kind": error_kind(exc),
            "worker": _worker_address(),
        }
    if isinstance(got, str):
        return {"status": "busy", "holder": got, "worker": _worker_address()}
    _service().done_with(got)
    return {"status": "ok", "ready": got.ready, "worker": _worker_address()}


def run_task(
    run_id: str,
    device: str,
    policy: RunPolicy,
    job: Job,
    files: dict[str, HostFile],
    payload: dict[str, bytes] | None,
    first: bool,
) -> dict[str, Any]:
    """Dask task: run one job on this worker's device and return its outcome (without the exception).

    Host files (models, inputs) come by content: a worker that lacks one answers "need" and the controller
    sends the bytes once; after that the worker's copy serves every later job and run.
    """
    service = _service()
    worker = _worker_address()
    try:
        if payload:
            service.store_files(files, payload)
        missing = service.missing_files(files)
    except (OSError, LabError) as exc:
        message = f"{device}: cannot stage files on worker {worker}: {one_line(exc)}"
        failed = error_outcome(job, message, "lab")
        return {"status": "done", "outcome": _portable(failed, job), "worker": worker}
    if missing:
        return {"status": "need", "missing": missing, "worker": worker}
    try:
        got = service.acquire(run_id, device, policy)
    except Exception as exc:  # noqa: BLE001
        failed = error_outcome(job, one_line(exc), error_kind(exc))
        return {"status": "done", "outcome": _portable(failed, job), "worker": worker}
    if isinstance(got, str):
        return {"status": "busy", "holder": got, "worker": worker}
    try:
        outcome = got.session.run(service.local_job(job, files), first)
    finally:
        service.done_with(got)
    return {"status": "done", "outcome": _portable(outcome, job), "worker": worker}


def release_task(run_id: str, device: str) -> bool:
    return _service().release(run_id, device)


def _portable(outcome: JobOutcome, job: Job) -> JobOutcome:
    """What travels back: the controller's own job, no exception object (it may not pickle)."""
    outcome.job = job
    outcome.exception = None
    return outcome


def serve_worker(
    scheduler: str,
    lab_dir: Path | None,
    *,
    devices: Sequence[str] | None = None,
    name: str | None = None,
    host: str | None = None,
    lock_dir: Path | None = None,
    idle_release_s: float = IDLE_RELEASE_S,
    death_timeout_s: float = 60.0,
    on_ready: Callable[[str, list[str]], None] | None = None,
) -> None:
    """Run a Dask worker holding this host's devices until it is told to stop (SIGTERM, SIGINT); LabError
    when it stops for another reason (its scheduler went away)."""
    lab = load_lab(lab_dir)
    names = list(devices) if devices else served_by_default(lab)
    for n in names:
        lab.get(n)  # unknown device: UserError, exit 2
    if not names:
        where = f" in {lab.folder}" if lab.folder else ""
        raise UserError(
            f"the worker holds no devices: no descriptors{where} (add `--device local` for this host)"
        )
    service = DeviceService(lab, names, lock_dir=lock_dir, idle_release_s=idle_release_s)
    asyncio.run(_serve(scheduler, service, names, name, host, death_timeout_s, on_ready))


def served_by_default(lab: Lab) -> list[str]:
    """The lab's devices a worker advertises when not told which: all but the host itself."""
    return [n for n in lab.names() if lab.get(n).transport != "local"]


async def _serve(
    scheduler: str,
    service: DeviceService,
    names: list[str],
    name: str | None,
    host: str | None,
    death_timeout_s: float,
    on_ready: Callable[[str, list[str]], None] | None,
) -> None:
    from distributed import Worker

    resources = {resource_name(n): 1.0 for n in names}
    worker = Worker(
        scheduler,
        nthreads=len(names) + 1,
        resources=resources,
        name=name,
        host=host,
        plugins=(service,),
        dashboard=False,
        memory_limit=0,
        death_timeout=death_timeout_s,
    )
    loop = asyncio.get_running_loop()
    asked = asyncio.Event()

    def stop() -> None:
        asked.set()
        asyncio.ensure_future(worker.close())

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        await worker
    except Exception as exc:  # noqa: BLE001 - the scheduler could not be reached in time
        raise LabError(f"cannot join the Dask scheduler at {scheduler}: {one_line(exc)}") from None
    try:
        if on_ready is not None:
            on_ready(str(worker.address), names)
        await worker.finished()
    finally:
        service.teardown()
    if not asked.is_set():  # not our signal: the scheduler went away (or closed us); a supervisor restarts
        raise LabError(f"worker {worker.address} stopped: it lost the Dask scheduler at {scheduler}")


# ---- controller side --------------------------------------------------------------------------------
class WorkerLost(LabError):
    """No worker holding the device is left to run its job."""


class TaskLost(LabError):
    """The task vanished with its worker (Dask cancelled it); it may be submitted again."""


def quiet_orphaned_gather_waits(loop: asyncio.AbstractEventLoop) -> None:
    """Keep the client's loop from printing a traceback for each gather wait it orphaned.

    distributed's gather watches each key in a task of its own; when the gather ends early (its task was
    cancelled or lost with a worker, or the client closes), those tasks end in AllExit with nobody to
    read it, and asyncio logs "Task exception was never retrieved" with a traceback on the controller's
    stderr. That is the expected end of a wait nobody needs; anything else still reaches the handler
    the loop had."""
    from distributed.client import AllExit

    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), AllExit):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


class ClusterExecutor:
    """The controller's connection to the cluster; makes one ClusterSession per device."""

    def __init__(
        self,
        address: str,
        run_id: str,
        policy: RunPolicy,
        *,
        grace_s: float | None = None,
        connect_timeout_s: float = 15.0,
        poll_s: float = POLL_S,
    ) -> None:
        from distributed import Client

        self.address = address
        self.run_id = run_id
        self.policy = policy
        self.grace_s = policy.worker_grace_s if grace_s is None else grace_s
        self.poll_s = poll_s
        try:
            self.client = Client(address, timeout=f"{connect_timeout_s}s", set_as_default=False)
        except Exception as exc:  # noqa: BLE001 - OSError, TimeoutError, ValueError (bad address) ...
            raise LabError(f"cannot reach the Dask scheduler at {address}: {one_line(exc)}") from None
        quiet_orphaned_gather_waits(self.client.loop.asyncio_loop)
        self._hashes = HashCache()
        self._lock = threading.Lock()
        self._gone_since: dict[str, float] = {}

    def session(self, device: str) -> ClusterSession:
        return ClusterSession(self, device)

    def close(self) -> None:
        try:
            self.client.close(timeout=10)
        except Exception:  # noqa: BLE001 - closing a client of a dead scheduler is best effort
            pass

    def holders(self, device: str) -> list[str]:
        """Addresses of the workers that advertise the device."""
        try:
            workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        except Exception:  # noqa: BLE001 - a scheduler hiccup counts as "nobody holds it right now"
            return []
        key = resource_name(device)
        return [addr for addr, w in workers.items() if (w.get("resources") or {}).get(key, 0) >= 1]

    def await_holder(self, device: str) -> list[str]:
        """The workers holding the device, once some do; WorkerLost once none has for grace_s."""
        while True:
            holders = self.holders(device)
            if holders:
                with self._lock:
                    self._gone_since.pop(device, None)
                return holders
            with self._lock:
                since = self._gone_since.setdefault(device, time.monotonic())
            if time.monotonic() - since >= self.grace_s:
                raise WorkerLost(f"no worker of the cluster at {self.address} holds device '{device}'")
            time.sleep(POLL_S)

    def file_index(self, job: Job) -> dict[str, HostFile]:
        """Host files the job needs, by path, so workers can tell which they already have."""
        with self._lock:
            return host_files(job, self._hashes)

    def submit(
        self, fn: Callable[..., Any], device: str, *args: Any, workers: list[str] | None = None
    ) -> Any:
        key = f"edgebench-{fn.__name__}-{device}-{uuid.uuid4().hex[:12]}"
        return self.client.submit(
            fn,
            *args,
            key=key,
            resources={resource_name(device): 1},
            pure=False,
            workers=workers,
            allow_other_workers=False,
            retries=0,
        )

    def wait(self, future: Any, device: str, workers: list[str] | None = None) -> Any:
        """The task's result. WorkerLost when no worker holds the device any more, TaskLost when Dask
        dropped the task with its worker, or when every worker it was pinned to (`workers`) is gone: the
        scheduler would keep such a task waiting for them for ever. Never a hang.

        The result is fetched only once the task is done (a done-callback says when): device threads share
        the client's one gather, and a `future.result(timeout)` that timed out in one thread cancelled
        that gather under another, which distributed's sync() then reported as UnboundLocalError (it
        catches Exception, and asyncio's CancelledError is not one)."""
        from distributed import CancelledError
        from distributed.scheduler import KilledWorker

        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        while True:
            if not done.wait(self.poll_s):
                self._check_holders(future, device, workers)
                continue
            try:
                return future.result(timeout=GATHER_TIMEOUT_S)
            except TimeoutError:
                raise TaskLost(
                    f"{device}: its job ended but its result did not arrive in {GATHER_TIMEOUT_S:.0f} s"
                ) from None
            except UnboundLocalError:  # sync()'s lost CancelledError: another thread's fetch gave up on ours
                raise TaskLost(f"{device}: fetching its job's result was cancelled") from None
            except KilledWorker as exc:
                raise WorkerLost(f"{device}: the workers running its job kept dying ({exc})") from None
            except (CancelledError, OSError) as exc:
                raise TaskLost(f"{device}: the job was lost with its worker ({type(exc).__name__})") from None

    def _check_holders(self, future: Any, device: str, workers: list[str] | None) -> None:
        """While a task runs: WorkerLost once no worker holds its device, TaskLost once the workers it was
        pinned to are gone (the task is cancelled then)."""
        try:
            holders = self.await_holder(device)
        except WorkerLost:
            future.cancel()
            raise
        if workers and not set(workers) & set(holders):
            future.cancel()
            gone = ", ".join(workers)
            raise TaskLost(f"{device}: the worker its job was pinned to is gone ({gone})")


class ClusterSession:
    """A device held by some worker of the cluster, seen from the controller.

    Once a worker has opened the device's session (its lease, connection and health check), every later
    task of the device goes to that worker (`home`): another worker sharing the device would only wait for
    that lease. Only when the home worker is gone may the next task go to any worker holding the device.
    """

    def __init__(self, executor: ClusterExecutor, device: str) -> None:
        self.executor = executor
        self.device = device
        self._last_worker: str | None = None
        self.home: str | None = None

    def prepare(self, on_state: StateFn) -> DeviceReady:
        ex = self.executor
        on_state("connecting", f"on the cluster at {ex.address}")
        args = (ex.run_id, self.device, ex.policy)
        reply = self._until_done(lambda: (prepare_task, args, None), on_state)
        if reply["status"] == "error":
            raise LabError(reply["error"])
        self.home = reply.get("worker")
        ready: DeviceReady = reply["ready"]
        return replace(ready, notes=(*ready.notes, f"on worker {self._last_worker}"))

    def run(self, job: Job, first: bool) -> JobOutcome:
        ex = self.executor
        try:
            files = ex.file_index(job)
        except OSError as exc:
            return error_outcome(job, f"cannot read {exc.filename}: {exc.strerror}", "usage")
        shipment: dict[str, Any] = {"payload": None, "workers": None}

        def task() -> tuple[Callable[..., Any], tuple[Any, ...], list[str] | None]:
            args = (ex.run_id, self.device, ex.policy, job, files, shipment["payload"], first)
            return run_task, args, shipment["workers"]

        def on_need(reply: dict[str, Any]) -> None:
            # Send the bytes to the worker that asked, once; later jobs find them in its cache.
            worker = reply["worker"]
            data = {p: Path(p).read_bytes() for p in reply["missing"]}
            shipment["payload"] = ex.client.scatter(data, workers=[worker], hash=False, timeout=60)
            shipment["workers"] = [worker]

        def on_lost() -> None:
            # The shipped bytes may have died with the worker: the next worker asks for them again.
            shipment.update(payload=None, workers=None)

        try:
            reply = self._until_done(task, lambda state, detail: None, on_need, on_lost)
        except (WorkerLost, TaskLost) as exc:
            return error_outcome(job, one_line(exc), "lab", exc)
        except Exception as exc:  # noqa: BLE001 - anything the cluster throws is this job's failure, not a crash
            return error_outcome(
                job, f"{self.device}: cluster error: {type(exc).__name__}: {one_line(exc)}", "lab", exc
            )
        finally:
            shipment.clear()  # drop the scattered bytes: the worker keeps them on disk
        outcome: JobOutcome = reply["outcome"]
        outcome.job = job
        self.home = reply.get("worker")  # where the session lives now (a new worker after a lost one)
        return outcome

    def _home_workers(self) -> list[str] | None:
        """[the home worker] while it still holds the device; None (any holder) once it is gone."""
        if self.home is not None and self.home not in self.executor.holders(self.device):
            self.home = None
        return [self.home] if self.home else None

    def _until_done(
        self,
        task: Callable[[], tuple[Callable[..., Any], tuple[Any, ...], list[str] | None]],
        on_state: StateFn,
        on_need: Callable[[dict[str, Any]], None] | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Submit until the task answers for real: again after a lost worker (a few times), after
        "need" (files shipped), and after "busy" (another run holds the device: queue)."""
        ex = self.executor
        losses, needs, start = 0, 0, time.monotonic()
        while True:
            ex.await_holder(self.device)
            fn, args, workers = task()
            workers = workers or self._home_workers()
            try:
                reply = ex.wait(ex.submit(fn, self.device, *args, workers=workers), self.device, workers)
            except TaskLost:
                losses += 1
                if losses > MAX_LOSSES:
                    raise
                if on_lost is not None:
                    on_lost()
                continue
            self._last_worker = reply.get("worker")
            status = reply["status"]
            if status == "need":
                needs += 1
                if on_need is None or needs > MAX_LOSSES:
                    raise LabError(f"{self.device}: worker {self._last_worker} keeps asking for files")
                try:
                    on_need(reply)
                except OSError as exc:  # the worker that asked went away while its files were shipped
                    needs, losses = needs - 1, losses + 1  # a lost worker, not one asking again
                    if losses > MAX_LOSSES:
                        raise TaskLost(
                            f"{self.device}: files could not reach a worker: {one_line(exc)}"
                        ) from None
                    if on_lost is not None:
                        on_lost()
                continue
            if status != "busy":
                return reply
            waited = time.monotonic() - start
            if ex.policy.lease_timeout_s is not None and waited >= ex.policy.lease_timeout_s:
                raise LeaseTimeout(f"{self.device}: still leased ({reply['holder']}) after {waited:.0f} s")
            on_state("queued", reply["holder"])
            time.sleep(BUSY_RETRY_S)

    def close(self) -> None:
        ex = self.executor
        if not ex.holders(self.device):
            return
        workers = [self._last_worker] if self._last_worker else None
        try:
            ex.submit(release_task, self.device, ex.run_id, self.device, workers=workers).result(timeout=10)
        except Exception:  # noqa: BLE001 - an idle worker releases on its own after idle_release_s
            pass
