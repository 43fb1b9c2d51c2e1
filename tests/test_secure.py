"""The secure cluster (docs/cluster.md) with the real servers on loopback: a Dask scheduler
with mutual TLS (`tengen cluster certs`), `mlflow server --app-name basic-auth` and a Prefect
server with its auth string (`tengen cluster secrets`, `tengen cluster users`). What each
refuses, a run through all three that leaks none of their secrets, and a tampered champion in
the registry that `tengen gtp` refuses to play."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from flows import cluster
from play.mlflow_store import shown
from stages.params import ClusterParams, MlflowParams, ParamsError, section
from tests.conftest import REPO, make_run_repo, run_in
from tests.test_fanout import files_of, in_process, params_file, stage_command, stop
from tests.test_remote import free_port, tengen

DASK = str(Path(sys.executable).parent / "dask")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """The cluster's CA and certificates, as `tengen cluster certs` makes them."""
    folder = tmp_path_factory.mktemp("secure") / "certs"
    done = tengen("cluster", "certs", str(folder), "--host", "127.0.0.1")
    assert done.returncode == 0, done.stderr
    assert "dask scheduler --protocol tls --host 127.0.0.1" in done.stdout
    return folder


def security(folder: Path, role: str = "client") -> dict:
    return {"ca_file": str(folder / "ca.pem"), "cert": str(folder / f"{role}.pem"),
            "key": str(folder / f"{role}.key")}  # fmt: skip


def cluster_of(address: str | None, tls: dict | None) -> ClusterParams:
    raw = {"cluster": {"address": address, "worker_threads": 1, "resources": {}, "security": tls}}
    return section(raw, "cluster", ClusterParams, source="params.yaml")


def own(certs: Path, role: str) -> list[str]:
    return ["--tls-cert", str(certs / f"{role}.pem"), "--tls-key", str(certs / f"{role}.key")]


@contextlib.contextmanager
def tls_cluster(certs: Path, logs: Path, env: dict, workers: int):
    """`dask scheduler` with TLS and `workers` TLS workers, as docs/cluster.md starts them.
    Yields the tls:// address once every worker has joined."""
    from distributed import Client

    from stages.fanout import dask_security

    address = f"tls://127.0.0.1:{free_port()}"
    tls = ["--tls-ca-file", str(certs / "ca.pem")]
    logs.mkdir(parents=True, exist_ok=True)
    processes = []

    def start(name: str, *cmd: str) -> None:
        with (logs / f"{name}.log").open("w") as out:
            processes.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))

    try:
        port = address.rsplit(":", 1)[1]
        start("scheduler", DASK, "scheduler", "--protocol", "tls", "--host", "127.0.0.1",
              "--port", port, "--no-dashboard", *tls, *own(certs, "scheduler"))  # fmt: skip
        for k in range(workers):
            start(f"worker-{k}", DASK, "worker", address, "--nthreads", "1", "--no-nanny",
                  "--no-dashboard", *tls, *own(certs, "worker"))  # fmt: skip
        secure = dask_security(cluster_of(address, security(certs)))
        deadline = time.time() + 120
        while True:  # the scheduler takes a moment to listen
            try:
                with Client(address, security=secure, timeout="10s", set_as_default=False) as c:
                    c.wait_for_workers(workers, timeout=120)
                break
            except OSError:
                assert time.time() < deadline, (logs / "scheduler.log").read_text()[-2000:]
                time.sleep(1)
        yield address
    finally:
        stop(processes)


# -- Dask over TLS ----------------------------------------------------------------------------


def test_cluster_certs_are_private_and_never_overwritten_nor_made_in_a_repository(tmp_path):
    folder = tmp_path / "certs"
    cluster.make_certs(folder, ["127.0.0.1", "head.lan"])
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in cluster.cert_files():
        mode = stat.S_IMODE((folder / name).stat().st_mode)
        assert mode == 0o600 if name.endswith(".key") else not mode & 0o022, (name, oct(mode))
    from cryptography import x509

    scheduler = x509.load_pem_x509_certificate((folder / "scheduler.pem").read_bytes())
    names = scheduler.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["head.lan"]
    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    scheduler.verify_directly_issued_by(ca)
    before = (folder / "ca.key").read_bytes()
    again = tengen("cluster", "certs", str(folder), "--host", "127.0.0.1")
    assert again.returncode == 2 and "nothing was overwritten" in again.stderr
    assert (folder / "ca.key").read_bytes() == before
    # An existing folder others may enter is refused, and left as it was (/tmp, a home).
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    refused = tengen("cluster", "certs", str(shared), "--host", "127.0.0.1")
    assert refused.returncode == 2 and "others may enter it (mode 0o755" in refused.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755 and not any(shared.iterdir())
    # The environment files read back in a shell as written, a space in the path and all.
    spaced = tmp_path / "my secrets"
    cluster.make_secrets(spaced, "10.0.0.1")
    server = spaced / cluster.SERVER_ENV
    shell = f'set -a; . "{server}"; echo "$MLFLOW_AUTH_CONFIG_PATH"'
    echoed = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True)
    assert echoed.stdout.strip() == str(spaced / cluster.AUTH_INI)
    assert cluster.read_env(server)["MLFLOW_AUTH_CONFIG_PATH"] == str(spaced / cluster.AUTH_INI)
    inside = tengen("cluster", "secrets", str(REPO / "cluster-secrets"), "--host", "127.0.0.1")
    assert inside.returncode == 2 and "inside the git work tree" in inside.stderr
    assert not (REPO / "cluster-secrets").exists()


def test_cluster_security_goes_with_a_tls_address_only(tmp_path, certs):
    with pytest.raises(ParamsError, match="cluster: security: tls://h:8786 is a TLS scheduler"):
        cluster_of("tls://h:8786", None)
    with pytest.raises(ParamsError, match=r"a password in it .*got 'http://u:\*\*\*@h:5000'"):
        section({"mlflow": {"enabled": True, "tracking_uri": "http://u:secret@h:5000",
                            "experiment": "e", "registered_model": "m"}}, "mlflow", MlflowParams,
                source="params.yaml")  # fmt: skip
    assert shown("postgresql://u:secret@db/x") == "postgresql://u:***@db/x"
    section(
        {
            "mlflow": {
                "enabled": True,
                "tracking_uri": "postgresql://u@db/x",
                "experiment": "e",
                "registered_model": "m",
            }
        },
        "mlflow",
        MlflowParams,
        source="params.yaml",
    )  # fmt: skip  (a user without a password: .pgpass)
    with pytest.raises(ParamsError, match="not local:2"):
        cluster_of("local:2", security(certs))
    assert cluster_of("tls://h:8786", security(certs)).security.cert.endswith("client.pem")
    from stages.fanout import dask_security

    missing = dict(security(certs), key=str(tmp_path / "nowhere.key"))
    with pytest.raises(ParamsError, match=r"cluster\.security\.key: .*nowhere\.key does not exist"):
        dask_security(cluster_of("tls://h:8786", missing))


@pytest.mark.slow
def test_a_tls_scheduler_refuses_plain_and_foreign_clients_and_plays_a_run(
    tmp_path, certs, tiny_model, prefect_api
):
    """A TLS scheduler with two workers: a tcp:// client and one whose certificate another CA
    signed are refused (the stage exits 2 before any shard); self-play of two generations
    (uniform priors, then a net) through it gives one process's files byte for byte."""
    from distributed import Client
    from prefect.settings import PREFECT_API_URL

    from stages.fanout import _answers, dask_security, worker_environment
    from tests.test_fanout import environment

    foreign = tmp_path / "foreign"
    cluster.make_certs(foreign, ["127.0.0.1"])
    env = dict(environment(tmp_path), PREFECT_API_URL=PREFECT_API_URL.value())
    env.update(worker_environment(1))
    with tls_cluster(certs, tmp_path / "dask", env, workers=2) as address:
        plain = address.replace("tls://", "tcp://")
        with pytest.raises(OSError), Client(plain, timeout="5s", set_as_default=False):
            pass
        stranger = dask_security(cluster_of(address, security(foreign)))
        with pytest.raises(OSError), Client(address, security=stranger, timeout="5s",
                                            set_as_default=False):  # fmt: skip
            pass
        with pytest.raises(ParamsError, match="no Dask scheduler answered with cluster.security"):
            _answers(cluster_of(address, security(foreign)))
        shape = dict(games=6, shards=3, rows_per_shard=40)
        refused = tmp_path / "refused"
        refused.mkdir()
        path = params_file(refused, cluster={"address": address,
                                             "security": security(foreign)}, **shape)  # fmt: skip
        done = subprocess.run(stage_command(path, refused / "gen-0", 0, None),
                              capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
        assert done.returncode == 2, done.stderr[-3000:]
        assert "no Dask scheduler answered" in done.stderr and not (refused / "gen-0").exists()

        for generation, model in ((0, None), (1, tiny_model)):
            here = in_process(tmp_path, "here", generation, model, **shape)
            folder = tmp_path / "tls"
            folder.mkdir(exist_ok=True)
            path = params_file(folder, cluster={"address": address,
                                                "security": security(certs)}, **shape)  # fmt: skip
            out = folder / f"gen-{generation}"
            done = subprocess.run(stage_command(path, out, generation, model),
                                  capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
            assert done.returncode == 0, done.stderr[-3000:]
            assert f"3 shards on {address}" in done.stderr
            assert files_of(out) == files_of(here)
            metrics = json.loads((folder / f"gen-{generation}.json").read_text())
            assert metrics["cluster"] == address and metrics["workers"] == 2


# -- MLflow and Prefect with logins, and the whole recipe ---------------------------------------


def wait_for(url: str, process: subprocess.Popen, what: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers (a login wanted is an answer)
        except OSError:
            pass
        assert process.poll() is None, f"{what} exited"
        assert time.time() < deadline, f"{what} did not answer in {timeout} s"
        time.sleep(0.5)


def request_of(url: str, data: bytes | None, auth: str | None) -> urllib.request.Request:
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    return request


def post(url: str, auth: str) -> list:
    with urllib.request.urlopen(request_of(url, b"{}", auth), timeout=30) as r:
        return json.loads(r.read())


def status_of(url: str, data: bytes | None = None, auth: str | None = None) -> int:
    try:
        with urllib.request.urlopen(request_of(url, data, auth), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def flat(text: str) -> str:
    """An error as typer's box shows it, back on one line."""
    return " ".join(text.translate(str.maketrans("", "", "│╭╮╰╯─")).split())


def with_env(base: dict, path: Path) -> dict:
    return {**base, **cluster.read_env(path)}


@pytest.mark.slow
def test_the_secure_recipe_end_to_end(tmp_path, certs, tiny_model):
    """docs/cluster.md's secure recipe on one machine: every server refuses a client without
    its login, the run goes through all of them with the loop's, no secret reaches the run's
    git, DVC, MLflow or logs, the player reads but cannot move `champion`, and a checkpoint
    put in the registry over the run's champion is refused by `tengen gtp`."""
    secrets_dir = tmp_path / "secrets"
    made = tengen("cluster", "secrets", str(secrets_dir), "--host", "127.0.0.1")
    assert made.returncode == 0, made.stderr
    for name in cluster.secret_files():
        assert stat.S_IMODE((secrets_dir / name).stat().st_mode) == 0o600, name
    mlflow_port, prefect_port = free_port(), free_port()
    # The recipe's ports are 5000 and 4200; here free ones.
    for name in (cluster.LOOP_ENV, cluster.PLAYER_ENV, cluster.ADMIN_ENV, cluster.WORKER_ENV):
        path = secrets_dir / name
        path.write_text(path.read_text().replace(":5000", f":{mlflow_port}")
                        .replace(":4200/", f":{prefect_port}/"))  # fmt: skip
    server_env = with_env(dict(os.environ), secrets_dir / cluster.SERVER_ENV)
    server_env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        server_env.pop(key, None)
    secret_values = [
        v for name in cluster.secret_files() if name.endswith(".env")
        for k, v in cluster.read_env(secrets_dir / name).items()
        if "PASSWORD" in k or "AUTH_STRING" in k or "SECRET_KEY" in k
    ]  # fmt: skip
    assert len(set(secret_values)) == 5  # admin, loop, player, Prefect, Flask's key
    store = tmp_path / "mlflow"
    processes = []
    try:
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
             "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{store}/mlflow.db",
             "--artifacts-destination", str(store / "artifacts")],
            env=server_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        ))  # fmt: skip
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
             "--port", str(prefect_port)],
            env=server_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        ))  # fmt: skip
        mlflow_url = f"http://127.0.0.1:{mlflow_port}"
        prefect_url = f"http://127.0.0.1:{prefect_port}/api"
        wait_for(f"{mlflow_url}/health", processes[0], "mlflow server")
        wait_for(f"{prefect_url}/health", processes[1], "prefect server")

        # MLflow: no login, no answer.
        search = f"{mlflow_url}/api/2.0/mlflow/experiments/search?max_results=1"
        assert status_of(search) == 401
        loop = cluster.read_env(secrets_dir / cluster.LOOP_ENV)
        login = f"{loop['MLFLOW_TRACKING_USERNAME']}:{loop['MLFLOW_TRACKING_PASSWORD']}"
        # Prefect: no auth string, no answer; with it, an answer.
        flows = f"{prefect_url}/flows/filter"
        assert status_of(flows, b"{}") == 401
        assert status_of(flows, b"{}", auth=loop["PREFECT_API_AUTH_STRING"]) == 200
        no_string = dict(os.environ, PREFECT_API_URL=prefect_url)
        no_string.pop("PREFECT_API_AUTH_STRING", None)
        refused = subprocess.run(
            [sys.executable, "-c", "from prefect.client.orchestration import get_client\n"
             "with get_client(sync_client=True) as c: c.read_flows()"],
            env=no_string, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert refused.returncode != 0 and "401" in refused.stderr

        users = tengen("cluster", "users", str(secrets_dir))
        assert users.returncode == 0, users.stderr
        again = tengen("cluster", "users", str(secrets_dir))  # changes nothing
        assert again.returncode == 0 and "tengen manages 'tengen'" in again.stdout, again.stderr
        assert status_of(search, auth=login) == 200

        repo = make_run_repo(tmp_path / "run", code_deps=False, win_fraction=0.0)
        worker_env = with_env(dict(os.environ), secrets_dir / cluster.WORKER_ENV)
        worker_env["PYTHONPATH"] = str(REPO)
        with tls_cluster(certs, tmp_path / "dask", worker_env, workers=2) as address:
            params = yaml.safe_load((repo / "params.yaml").read_text())
            # The workers' torch threads (cluster.worker_threads) in one process too: other
            # thread counts sum floats in another order, and the games part ways.
            params["selfplay"].update(shards=2, threads=1)
            params["cluster"].update(address=address, security=security(certs))
            (repo / "params.yaml").write_text(yaml.safe_dump(params))
            run_in(repo, "git", "commit", "-qam", "on the secure cluster")
            loop_env = with_env(dict(os.environ), secrets_dir / cluster.LOOP_ENV)
            # A wrong password: refused at once, said whose, exit 2, nothing run.
            wrong = dict(loop_env, MLFLOW_TRACKING_PASSWORD="not-the-password-at-all")
            bad = tengen("run", "--repo", str(repo), env=wrong, timeout=600)
            assert bad.returncode == 2, bad.stderr[-3000:]
            assert "refused the login of user 'tengen' (401 Unauthorized)" in bad.stderr
            assert "not-the-password-at-all" not in bad.stderr + bad.stdout
            assert not (repo / "models").exists()
            # A wrong Prefect auth string: the same.
            wrong = dict(loop_env, PREFECT_API_AUTH_STRING="tengen:not-the-string")
            bad = tengen("run", "--repo", str(repo), env=wrong, timeout=600)
            assert bad.returncode == 2, bad.stderr[-3000:]
            assert "Prefect API at" in bad.stderr and "refused this client (401" in bad.stderr
            assert not (repo / "models").exists()
            done = tengen("run", "--repo", str(repo), env=loop_env)
            assert done.returncode == 0, done.stderr[-4000:]
        for n in (0, 1):
            metrics = json.loads((repo / f"reports/selfplay/gen-{n}.json").read_text())
            assert metrics["cluster"] == address and metrics["workers"] == 2
        # The same run in one process, its own SQLite store: the same data and models.
        alone = tmp_path / "alone"
        # Not the outputs, nor DVC's cache, whose run cache would restore them.
        left = shutil.ignore_patterns(
            "data", "models", "reports", "logs", "dvc.lock", "cache", "tmp"
        )
        shutil.copytree(repo, alone, ignore=left)
        params["cluster"].update(address=None, security=None)
        (alone / "params.yaml").write_text(yaml.safe_dump(params))
        plain = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_"))}
        done = tengen("run", "--repo", str(alone), env=plain)
        assert done.returncode == 0, done.stderr[-4000:]
        # (promotion.json copies the gate's decision, which says where its games ran.)
        made, there = ({part: {name: sha for name, sha in files_of(top / part).items()
                               if not name.endswith("promotion.json")}
                        for part in ("data", "models")} for top in (repo, alone))  # fmt: skip
        assert made == there
        assert {"gen-1/champion/champion.pt", "selfplay/gen-1/part-1.parquet"} <= {
            *made["models"],
            *made["data"],
        }

        # The Prefect server saw the run's flows (the loop's and the shards').
        names = {f["name"] for f in post(f"{prefect_url}/flow_runs/filter",
                                         loop["PREFECT_API_AUTH_STRING"])}  # fmt: skip
        assert {"selfplay gen-0", "selfplay gen-1"} <= names

        # No secret anywhere in the run: its files (DVC's cache, logs, reports, dvc.lock), its
        # git history, its MLflow params and tags.
        text = run_in(repo, "git", "log", "-p", "--all")
        leaks = [v for v in secret_values if v in text]
        for path in repo.rglob("*"):
            if path.is_file() and ".git" not in path.relative_to(repo).parts:
                data = path.read_bytes()
                leaks += [f"{path}: {v[:4]}..." for v in secret_values if v.encode() in data]
        from mlflow import MlflowClient

        admin = cluster.read_env(secrets_dir / cluster.ADMIN_ENV)
        with cluster._login(admin):
            client = MlflowClient(mlflow_url)
            exp = client.get_experiment_by_name("tengen")
            runs = client.search_runs([exp.experiment_id], max_results=500)
            assert len(runs) >= 10
            logged = json.dumps([[r.data.params, r.data.tags] for r in runs])
            versions = client.search_model_versions("name = 'tengen'")
            logged += json.dumps([v.tags for v in versions]) + json.dumps(exp.tags)
        leaks += [f"mlflow: {v[:4]}..." for v in secret_values if v in logged]
        assert not leaks, leaks

        # The player: plays the champion (its SHA-256 in the run's history), cannot move it.
        player_env = with_env(dict(os.environ), secrets_dir / cluster.PLAYER_ENV)
        gtp = ["gtp", "--model", "models:/tengen@champion", "--lineage", str(repo), "--size", "5"]
        played = subprocess.run([sys.executable, "-m", "flows.cli", *gtp], input="name\nquit\n",
                                capture_output=True, text=True, env=player_env, cwd=REPO,
                                timeout=600)  # fmt: skip
        assert played.returncode == 0 and "= tengen" in played.stdout, played.stderr[-2000:]
        unchecked = subprocess.run([sys.executable, "-m", "flows.cli", *gtp[:3]], input="quit\n",
                                   capture_output=True, text=True, env=player_env,
                                   cwd=tmp_path, timeout=600)  # fmt: skip
        assert unchecked.returncode == 2 and "give --lineage DIR" in flat(unchecked.stderr)
        from mlflow.exceptions import MlflowException

        from play.mlflow_store import said

        player = cluster.read_env(secrets_dir / cluster.PLAYER_ENV)
        with cluster._login(player):
            client = MlflowClient(mlflow_url)
            champion = client.get_model_version_by_alias("tengen", "champion")
            with pytest.raises(MlflowException) as denied:
                client.set_registered_model_alias("tengen", "champion", "1")
            assert "denied user 'player' a write (403 Forbidden)" in said(denied.value)
            with pytest.raises(MlflowException):
                client.delete_registered_model_alias("tengen", "champion")

        # A writer of the store (the loop's login, stolen) puts another net over the champion:
        # the player refuses it.
        with cluster._login(loop):
            client = MlflowClient(mlflow_url)
            evil = client.create_run(exp.experiment_id).info.run_id
            client.log_artifact(evil, str(tiny_model), "champion")
            client.set_terminated(evil)
            forged = client.create_model_version("tengen", f"runs:/{evil}/champion", evil)
            client.set_registered_model_alias("tengen", "champion", forged.version)
            assert forged.version != champion.version
        tampered = subprocess.run([sys.executable, "-m", "flows.cli", *gtp], input="quit\n",
                                  capture_output=True, text=True, env=player_env, cwd=REPO,
                                  timeout=600)  # fmt: skip
        assert tampered.returncode == 2, tampered.stderr[-2000:]
        said_there = flat(tampered.stderr)
        assert "refused: the checkpoint" in said_there and "not in the run's lineage" in said_there
    finally:
        for p in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
        for p in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=60)
