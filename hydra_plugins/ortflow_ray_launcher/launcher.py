"""``hydra/launcher=ray``: each job of a ``-m`` sweep (a grid, or a batch of the Optuna sweeper) runs as a Ray task.

Keys (``hydra.launcher.*``): ``address`` (a running cluster, e.g. ``127.0.0.1:6379`` or ``auto``; None: a local
Ray started for the sweep with ``init`` as ``ray.init`` arguments, stopped when the command ends), ``num_cpus``
(what each job reserves), ``max_retries`` (how many times Ray runs a job again when its worker or its node dies),
``remote`` (more ``.options()`` of the task: ``memory``, ``resources``, ``scheduling_strategy``...),
``runtime_env`` (Ray's runtime environment of the jobs, e.g. ``working_dir`` or ``pip`` for a cluster whose image
lacks the project), ``env_prefixes`` (the driver's environment variables starting with one of them reach the
jobs through ``runtime_env.env_vars``: by default ``MLFLOW_`` and ``ORTFLOW_``, so the jobs write to the driver's
tracking store and nest under its sweep run), ``check_fits`` (refuse, before any job, a job whose request fits no
node of the cluster: Ray would leave it pending for ever; false on an autoscaling cluster whose larger nodes start
on demand) and ``head_timeout`` (seconds the cluster's head may stop answering before the sweep stops with
:class:`RayClusterLostError`; Ray itself would end the driver after 60 s, leaving every run RUNNING).

Ray schedules, places and retries the tasks; this module is the glue Hydra's ``Launcher`` interface needs: the
job's config composed in the driver (as Hydra's basic launcher does), the task running it with Hydra's
``run_job`` after restoring Hydra's global state in the worker (as hydra-submitit-launcher does), and the
``JobReturn`` (status, return value, the config, the job's working directory) coming back to the driver. The
sweep folder is made absolute in the driver, so every job writes under the folder the driver names, whatever
the worker's current directory. A task whose retries are spent (its node lost again and again) comes back as a
FAILED ``JobReturn`` carrying a :class:`RayJobLostError` (the job, and the first lines of Ray's error), as a job
that raised would; a job killed by Ray's memory monitor counts as lost (its retries are ``max_retries`` too).
While the jobs run, the driver waits on them a second at a time and checks that the head (its GCS) still accepts
connections: a head lost for ``head_timeout`` seconds stops the sweep with an error naming the cluster and the
jobs that did not return.

Plugin discovery imports this module whenever Hydra starts: Ray is imported only when a sweep launches.
"""

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from pipelines.base.errors import UserError

_log = logging.getLogger(__name__)


@dataclass
class RayLauncherConf:
    _target_: str = "hydra_plugins.ortflow_ray_launcher.launcher.RayLauncher"
    address: Optional[str] = None
    num_cpus: float = 1
    max_retries: int = 3
    remote: Dict[str, Any] = field(default_factory=dict)
    runtime_env: Dict[str, Any] = field(default_factory=dict)
    env_prefixes: List[str] = field(default_factory=lambda: ["MLFLOW_", "ORTFLOW_"])
    # a local Ray (address null): ray.init's arguments, e.g. num_cpus (default: every CPU of the machine)
    init: Dict[str, Any] = field(default_factory=lambda: {"include_dashboard": False})
    check_fits: bool = True
    head_timeout: float = 30.0


class RayResourceError(UserError, ValueError):
    """A job asks for more than any node of the cluster has (Ray would leave it pending for ever)."""

    hint = ("lower hydra.launcher.num_cpus / hydra.launcher.remote (memory, resources, num_gpus), or add larger "
            "nodes; on an autoscaling cluster that starts them on demand, hydra.launcher.check_fits=false")


class RayJobLostError(UserError, RuntimeError):
    """Ray gave up on a job (its retries spent): its worker or node died, or Ray's memory monitor killed it."""

    hint = ("a job killed for memory needs fewer jobs per node (a larger hydra.launcher.num_cpus), larger nodes, or "
            "hydra.launcher.remote.memory to reserve what it uses; hydra.launcher.max_retries runs a lost job again")


class RayClusterLostError(UserError, RuntimeError):
    """The Ray cluster's head stopped answering while jobs ran: their results can never come back."""

    hint = ("the sweep's runs were ended; check the cluster (ray status), restart its head, and run the sweep "
            "again (hydra.launcher.head_timeout sets how long a head may stay silent)")
    #: the sweep's job runs still RUNNING are lost with the cluster (pipelines.tracking.sweep.fail_sweep)
    jobs_lost = True


ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayLauncherConf, provider="ortflow")


def _run(hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig,
         singleton_state: Dict[Any, Any]) -> JobReturn:
    """The Ray task: one Hydra job in a Ray worker, with the driver's Hydra state (config store, job runtime)."""
    setup_globals()
    Singleton.set_state(singleton_state)
    return run_job(hydra_context=hydra_context, task_function=task_function, config=config,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


class RayLauncher(Launcher):
    def __init__(self, address: Optional[str], num_cpus: float, max_retries: int, remote: Any, runtime_env: Any,
                 env_prefixes: Sequence[str], init: Any, check_fits: bool = True, head_timeout: float = 30.0) -> None:
        if num_cpus <= 0:
            raise ValueError(f"hydra.launcher.num_cpus={num_cpus}: each job needs a positive number of CPUs")
        if max_retries < -1:
            raise ValueError(f"hydra.launcher.max_retries={max_retries}: use >= 0, or -1 for no limit")
        if not head_timeout > 0:
            raise ValueError(f"hydra.launcher.head_timeout={head_timeout}: use a positive number of seconds")
        self.check_fits, self.head_timeout = check_fits, float(head_timeout)
        self.address, self.num_cpus, self.max_retries = address or None, num_cpus, max_retries
        self.remote, self.runtime_env, self.init = _plain(remote), _plain(runtime_env), _plain(init)
        self.env_prefixes = tuple(env_prefixes)
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        if not self.address or _on_loopback(self.address):
            # a Ray on this machine alone: Ray's own switch keeps it on 127.0.0.1 (else Ray replaces 127.0.0.1 by
            # the machine's outward address, listens on every interface and refuses a driver given 127.0.0.1);
            # read when Ray is first imported, so set before
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Ray ends a driver whose GCS stays silent for this long (60 s by default), before any cleanup: leave the
        # launcher time to stop the sweep itself first
        os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(max(60, int(self.head_timeout) + 30)))
        # a job killed by Ray's memory monitor is otherwise run again without limit (seen: a sweep waiting for
        # ever on a node short of memory); the driver owns the tasks, so its setting applies: max_retries, as for a
        # lost node
        os.environ.setdefault("RAY_task_oom_retries", str(self.max_retries))
        try:
            import ray
        except ImportError as error:
            raise ImportError("hydra/launcher=ray needs Ray: pip install 'ortflow[ray]' (or -e '.[ray]')") from error

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self._connect(ray)
        if self.check_fits:
            self._check_fits(ray)
        task = ray.remote(_run).options(num_cpus=self.num_cpus, max_retries=self.max_retries,
                                        runtime_env=self._runtime_env(), **self.remote)
        _log.info("Launching %d jobs on Ray (%s)", len(job_overrides), self.address or "local")
        # what every job shares goes to Ray's object store once
        shared = [ray.put(x) for x in (self.hydra_context, self.task_function, Singleton.get_state())]
        jobs = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            _log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(config):
                config.hydra.job.id = config.hydra.job.num = idx
                config.hydra.sweep.dir = str(sweep_dir)  # the driver's folder, whatever the worker's cwd
            context, task_function, state = shared
            jobs.append((config, task.remote(context, task_function, config, state)))
        self._wait(ray, jobs)
        return [self._result(ray, config, ref) for config, ref in jobs]

    def _request(self) -> Dict[str, float]:
        """What one job asks of a node, in Ray's resource names."""
        request = {"CPU": float(self.num_cpus), **{k: float(v) for k, v in self.remote.get("resources", {}).items()}}
        for option, name in (("memory", "memory"), ("num_gpus", "GPU")):
            if self.remote.get(option):
                request[name] = float(self.remote[option])
        return request

    def _check_fits(self, ray: Any) -> None:
        """Raise :class:`RayResourceError` unless some live node has every resource a job asks for (Ray leaves a
        task that fits no node pending for ever, with only a line of its autoscaler's log)."""
        request = self._request()
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        if any(all(node.get(k, 0.0) >= v for k, v in request.items()) for node in nodes):
            return
        largest = {k: max((node.get(k, 0.0) for node in nodes), default=0.0) for k in request}
        short = [k for k in request if request[k] > largest[k]]
        raise RayResourceError(
            f"each job asks Ray for {_amounts(request)} but no node of the cluster at {self.address or 'local'} "
            f"({len(nodes)} node(s)) has that much: {', '.join(short)} short, the largest node has "
            f"{_amounts(largest)}; Ray would leave the jobs pending for ever. Nothing was launched")

    def _wait(self, ray: Any, jobs: List[Any]) -> None:
        """Wait until every job has returned, a second at a time; raise :class:`RayClusterLostError` once the
        cluster's head (its GCS) has refused connections for ``head_timeout`` seconds."""
        gcs = ray.get_runtime_context().gcs_address
        pending, silent_since, problem = [ref for _, ref in jobs], None, ""
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            if not pending:
                return
            problem = _unanswered(gcs)
            if not problem:
                silent_since = None
                continue
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since >= self.head_timeout:
                waiting = [f"#{config.hydra.job.num}" for config, ref in jobs if ref in pending]
                raise RayClusterLostError(
                    f"the Ray cluster at {self.address or 'local'} was lost: its head (GCS {gcs}) has not accepted "
                    f"a connection for {self.head_timeout:g} s ({problem}); {len(waiting)} of {len(jobs)} jobs "
                    f"never returned ({', '.join(waiting)})")

    def _connect(self, ray: Any) -> None:
        if ray.is_initialized():
            return
        if self.address:
            ray.init(address=self.address)
        else:  # a local Ray for this command; Ray stops it when the command exits
            ray.init(address="local", **self.init)

    def _runtime_env(self) -> Optional[Dict[str, Any]]:
        env = {k: v for k, v in os.environ.items() if k.startswith(self.env_prefixes)}
        runtime_env = dict(self.runtime_env)
        if env:
            runtime_env["env_vars"] = {**env, **runtime_env.get("env_vars", {})}
        return runtime_env or None

    @staticmethod
    def _result(ray: Any, config: DictConfig, ref: Any) -> JobReturn:
        """The job's JobReturn; a task Ray gave up on (retries spent, node lost) as a FAILED one with the error."""
        try:
            ret = ray.get(ref)
            if ret.status == JobStatus.FAILED:  # the job raised: say so here too, not only in the worker's log
                _log.error("Ray job #%s (%s) failed: %s: %s", config.hydra.job.num,
                           " ".join(config.hydra.overrides.task), type(ret._return_value).__name__, ret._return_value)
            return ret
        except ray.exceptions.RayError as error:
            lost = RayJobLostError(f"Ray job #{config.hydra.job.num} ({' '.join(config.hydra.overrides.task)}) "
                                   f"was lost: {type(error).__name__}: {_first_lines(error)}")
            lost.ray_error = error
            _log.error("%s", lost)
            ret = JobReturn(overrides=list(config.hydra.overrides.task), hydra_cfg=config,
                            status=JobStatus.FAILED)
            ret.return_value = lost
            return ret


def _unanswered(address: str) -> str:
    """Why ``host:port`` does not accept a TCP connection within 2 s; empty when it does."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return ""
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"


def _first_lines(error: BaseException, lines: int = 2) -> str:
    """The first lines of Ray's message (an out-of-memory kill adds object-store statistics and a process table)."""
    text = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(text[:lines])[:1000]


def _amounts(resources: Dict[str, float]) -> str:
    """``CPU=2, memory=18.0 GiB``: Ray's resources as a user reads them."""
    return ", ".join(f"{k}={v / 2**30:.1f} GiB" if k in ("memory", "object_store_memory") else f"{k}={v:g}"
                     for k, v in resources.items())


def _on_loopback(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else dict(value or {})
