"""A team tracking server on one machine: a PostgreSQL 15 cluster holding MLflow's store, and ``mlflow server``
in front of it with proxied artifacts (clients upload and download them through the server).

    python -m pipelines.server --folder .ortflow/server --port 5000      # or: make server
    export MLFLOW_TRACKING_URI=http://127.0.0.1:5000

Everything lives under ``--folder``: ``pgdata/`` (the cluster), ``pgsock/`` (its Unix socket), ``artifacts/``
and the two logs. The cluster listens on 127.0.0.1 only and trusts local connections (a throwaway or
single-user set-up; a shared deployment uses its managed PostgreSQL and passes ``--backend-store-uri``).
Pages that log to the server from another origin (the browser example: docs/TRAINING_OUTSIDE_PYTHON.md) are
named by ``--cors-allowed-origins`` (MLflow's default: http://localhost:*, http://127.0.0.1:*), and the host
names they reach the server by, beyond localhost and private addresses, by ``--allowed-hosts``.
``initdb`` refuses to run as root, so as root the PostgreSQL commands run as the ``postgres`` user
(``runuser -u postgres --``), which must be able to reach ``--folder``. Binaries are looked up on PATH, then
under /usr/lib/postgresql/*/bin; where they are missing, ``make postgres`` installs the Debian package.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PG_USER = "postgres"
DATABASE = "mlflow"
#: a second database for Optuna studies (hydra.sweeper.storage): Optuna's tables stay apart from MLflow's
OPTUNA_DATABASE = "optuna"
# variables of the caller's shell that would redirect the server's own client code
_MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")


class ServerError(RuntimeError):
    """PostgreSQL or the mlflow server could not be started; the message names the step and its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pg_binary(name: str) -> str:
    """The path of a PostgreSQL program (``initdb``, ``pg_ctl``, ``createdb``)."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)),
                                       None)
    if not found:
        raise ServerError(f"PostgreSQL's {name!r} is not installed: run `make postgres` "
                          "(apt-get install postgresql-15) or put its bin folder on PATH")
    return found


def _as_pg_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", PG_USER, "--", *cmd] if os.geteuid() == 0 else cmd


class Postgres:
    """A PostgreSQL cluster in ``folder`` on 127.0.0.1:``port`` with the databases :data:`DATABASE` (MLflow's
    store) and :data:`OPTUNA_DATABASE` (shared Optuna studies)."""

    def __init__(self, folder: str | Path, port: int | None = None):
        self.folder = Path(folder).resolve()
        self.port = port or free_port()
        self.data = self.folder / "pgdata"
        self.socket_dir = self.folder / "pgsock"
        self.log = self.folder / "postgres.log"

    def uri_of(self, database: str) -> str:
        """SQLAlchemy URI of a database of the cluster (``postgresql://`` uses psycopg 3)."""
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{database}"

    @property
    def uri(self) -> str:
        """MLflow's backend store."""
        return self.uri_of(DATABASE)

    @property
    def optuna_uri(self) -> str:
        """Optuna's storage (``hydra.sweeper.storage``)."""
        return self.uri_of(OPTUNA_DATABASE)

    def _run(self, cmd: list[str], what: str) -> None:
        proc = subprocess.run(_as_pg_user(cmd), capture_output=True, text=True)
        if proc.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise ServerError(f"{what} failed ({proc.returncode}): {proc.stdout}{proc.stderr}{log}")

    def start(self) -> None:
        """initdb (first time only), start the server, create the database (first time only)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.folder, PG_USER)
            shutil.chown(self.socket_dir, PG_USER)
        fresh = not (self.data / "PG_VERSION").exists()
        if fresh:
            self._run([pg_binary("initdb"), "-D", str(self.data), "-U", PG_USER, "--auth=trust", "-E", "UTF8"],
                      f"initdb in {self.data}")
        options = f"-k {self.socket_dir} -c listen_addresses=127.0.0.1 -p {self.port} -c max_connections=200"
        self._run([pg_binary("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60",
                   "start"], f"pg_ctl start on port {self.port} (log {self.log})")
        if fresh:
            for database in (DATABASE, OPTUNA_DATABASE):
                self._run([pg_binary("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, database],
                          f"createdb {database}")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(_as_pg_user([pg_binary("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
                           capture_output=True)


def wait_ready(proc: subprocess.Popen, url: str, timeout: float, log: Path, what: str,
               interval: float = 0.3) -> None:
    """Wait until ``url`` answers 200 while ``proc`` runs; :class:`ServerError` naming ``what`` with the tail of
    ``log`` when ``proc`` exits or ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise ServerError(f"{what} exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ServerError(f"{what} not ready after {timeout:g} s: {log.read_text()[-3000:]}")
        time.sleep(interval)


class MlflowServer:
    """``mlflow server`` on 127.0.0.1:``port`` over ``backend_store_uri``, serving artifacts from
    ``folder/artifacts``; stopped as a whole process group (it forks uvicorn workers)."""

    #: what answers 200 once the server is ready
    ready_path = "/health"

    def __init__(self, folder: str | Path, backend_store_uri: str, port: int | None = None, workers: int = 2,
                 cors_allowed_origins: str | None = None, allowed_hosts: str | None = None):
        self.folder = Path(folder).resolve()
        self.backend_store_uri = backend_store_uri
        self.port = port or free_port()
        self.workers = workers
        #: ``mlflow server``'s own options (comma-separated; None: its defaults)
        self.security = {"--cors-allowed-origins": cors_allowed_origins, "--allowed-hosts": allowed_hosts}
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.folder / "mlflow-server.log"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend_store_uri,
                "--serve-artifacts", "--artifacts-destination", str(self.folder / "artifacts"),
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers),
                *[word for option, value in self.security.items() if value for word in (option, value)]]

    def environment(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k not in _MLFLOW_ENV}

    def start(self, timeout: float = 120) -> None:
        """Start the server and wait until :attr:`ready_path` answers."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.command(), cwd=self.folder, env=self.environment(), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(self.proc, f"{self.url}{self.ready_path}", timeout, self.log, "mlflow server")
        except ServerError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=5)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:  # uvicorn may wait for idle keep-alive connections
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None


class ModelServer(MlflowServer):
    """``mlflow models serve -m <model_uri> --env-manager local`` on 127.0.0.1:``port``, the model looked up in
    ``tracking_uri`` (``models:/<name>@champion``); ready when ``/ping`` answers, stopped as a process group."""

    ready_path = "/ping"

    def __init__(self, folder: str | Path, model_uri: str, tracking_uri: str, port: int | None = None):
        super().__init__(folder, tracking_uri, port, workers=1)
        self.model_uri = model_uri
        self.log = self.folder / "model-server.log"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "mlflow", "models", "serve", "-m", self.model_uri, "--env-manager", "local",
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)]

    def environment(self) -> dict[str, str]:
        env = super().environment()
        # it execs `uvicorn` by name: this interpreter's environment (an activated venv) comes first
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        return {**env, "MLFLOW_TRACKING_URI": self.backend_store_uri}


class TeamServer:
    """PostgreSQL plus ``mlflow server`` on it, started and stopped together (a context manager)."""

    def __init__(self, folder: str | Path, port: int | None = None, pg_port: int | None = None, workers: int = 2,
                 cors_allowed_origins: str | None = None, allowed_hosts: str | None = None):
        self.postgres = Postgres(folder, pg_port)
        self.mlflow = MlflowServer(folder, self.postgres.uri, port, workers, cors_allowed_origins, allowed_hosts)

    @property
    def url(self) -> str:
        return self.mlflow.url

    def start(self) -> "TeamServer":
        self.postgres.start()
        try:
            self.mlflow.start()
        except BaseException:
            self.postgres.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            self.mlflow.stop()
        finally:
            self.postgres.stop()

    def __enter__(self) -> "TeamServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipelines.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default=".ortflow/server", help="cluster, artifacts and logs (kept)")
    parser.add_argument("--port", type=int, default=5000, help="mlflow server port (0: a free one)")
    parser.add_argument("--pg-port", type=int, default=0, help="PostgreSQL port (0: a free one)")
    parser.add_argument("--workers", type=int, default=2, help="mlflow server (uvicorn) workers")
    parser.add_argument("--cors-allowed-origins", help="comma-separated origins of pages that call the server "
                        "(e.g. http://10.0.0.5:8000); default: MLflow's, http://localhost:* and http://127.0.0.1:*")
    parser.add_argument("--allowed-hosts", help="comma-separated Host headers the server answers beyond MLflow's "
                        "default (localhost and private addresses), e.g. mlflow.team.lan:5000")
    args = parser.parse_args(argv)
    server = TeamServer(args.folder, args.port or None, args.pg_port or None, args.workers,
                        args.cors_allowed_origins, args.allowed_hosts)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    with server:
        print(f"ortflow: PostgreSQL {server.postgres.uri} (data {server.postgres.data})")
        print(f"ortflow: mlflow server {server.url} (artifacts {server.mlflow.folder / 'artifacts'})")
        print(f"ortflow: Optuna storage for shared sweeps: hydra.sweeper.storage={server.postgres.optuna_uri}")
        print(f"  export MLFLOW_TRACKING_URI={server.url}    # Ctrl-C stops both", flush=True)
        try:
            while not stop and server.mlflow.proc is not None and server.mlflow.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
