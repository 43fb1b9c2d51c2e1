"""The secure cluster's files (docs/cluster.md): `tengen cluster certs` (a CA of the cluster's
own and a certificate per Dask role, for mutual TLS), `tengen cluster secrets` (the MLflow and
Prefect logins, in environment files of mode 600 outside every repository) and `tengen cluster
users` (the loop's and the players' MLflow users on a running tracking server).

Nothing here is ever written into a run folder: the folder given must lie outside every git
work tree, and an existing file is never overwritten.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import shlex
import subprocess
import warnings
from collections.abc import Iterable
from pathlib import Path

# Who holds each certificate: the scheduler (on the head), every worker, and the stages that
# submit shards (the client of `cluster.security`).
ROLES = ("scheduler", "worker", "client")
CA = "ca"
DASK_PORT = 8786
MLFLOW_PORT = 5000
PREFECT_PORT = 4200
DAYS = 825  # the certificates' lifetime; `tengen cluster certs` into a new folder renews them

# The environment files of `tengen cluster secrets`, each for the processes that read it.
SERVER_ENV = "server.env"  # the MLflow and Prefect servers on the head
LOOP_ENV = "loop.env"  # `tengen run` on the head: the loop's MLflow user, Prefect's string
WORKER_ENV = "worker.env"  # every `dask worker`: Prefect's string, to report shard tasks
PLAYER_ENV = "player.env"  # a player fetching the champion: the read-only MLflow user
ADMIN_ENV = "admin.env"  # `tengen cluster users`: MLflow's admin
AUTH_INI = "mlflow-auth.ini"  # `mlflow server --app-name basic-auth`'s configuration
LOOP_USER = "tengen"
PLAYER_USER = "player"
ADMIN_USER = "admin"


class ClusterError(ValueError):
    """A folder or file that would expose or overwrite a secret; the message says which."""


def _private_folder(folder: Path, names: Iterable[str]) -> Path:
    """`folder` made (mode 700) for new secret files: outside any git work tree, and none of
    `names` in it yet."""
    folder = folder.expanduser().resolve()
    inside = _work_tree_of(folder)
    if inside is not None:
        raise ClusterError(
            f"{folder} is inside the git work tree {inside}: secrets there could be "
            "committed; give a folder outside every repository (such as ~/.tengen/cluster)"
        )
    there = [n for n in names if (folder / n).exists()]
    if there:
        raise ClusterError(
            f"{folder} already holds {', '.join(there)}; nothing was overwritten (give a new "
            "folder, or move those files away to replace them)"
        )
    if folder.exists():
        _check_private(folder)
    else:
        folder.mkdir(parents=True, mode=0o700)
        folder.chmod(0o700)  # whatever the umask
    return folder


def _check_private(folder: Path) -> None:
    """ClusterError unless an existing `folder` is a folder of this user's that no one else
    may enter (it is never changed: it may be /tmp or a home)."""
    if not folder.is_dir():
        raise ClusterError(f"{folder} is not a folder")
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ClusterError(
            f"{folder} exists and others may enter it (mode {oct(info.st_mode & 0o777)}, "
            f"owner uid {info.st_uid}); give a new folder, which is made mode 700, or make "
            "this one yours and mode 700 first (chmod 700)"
        )


def _work_tree_of(folder: Path) -> Path | None:
    """The git work tree `folder` (or its nearest existing parent) lies in, if any."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    try:
        out = subprocess.run(["git", "-C", str(probe), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    except FileNotFoundError:  # no git: no work tree to leak into
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def _write_private(path: Path, data: bytes | str) -> None:
    """A file only its owner may read, made so from its first byte."""
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)


def cert_files() -> list[str]:
    return [f"{name}.{ext}" for name in (CA, *ROLES) for ext in ("pem", "key")]


def make_certs(folder: Path, hosts: list[str], *, days: int = DAYS) -> Path:
    """A CA of the cluster's own (ca.pem, ca.key) and, signed by it, a certificate and key per
    role (scheduler, worker, client): P-256 keys, each certificate good for serving and for
    connecting (Dask's workers and scheduler do both), the scheduler's naming `hosts`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = _private_folder(folder, cert_files())
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tengen cluster"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])  # fmt: skip

    def write(stem: str, key, cert) -> None:
        _write_private(folder / f"{stem}.key", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ))  # fmt: skip
        (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("tengen cluster CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    write(CA, ca_key, ca)
    for role in ROLES:
        key = ec.generate_private_key(ec.SECP256R1())
        names = [_san(h) for h in hosts] if role == "scheduler" else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(f"tengen {role}"))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        write(role, key, builder.sign(ca_key, hashes.SHA256()))
    return folder


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def certs_howto(folder: Path, host: str) -> str:
    """What to do with the certificates: the scheduler's and workers' command lines and the
    run's `cluster:` section."""
    f = {name: shlex.quote(str(folder / name)) for name in cert_files()}
    return f"""\
Made in {folder} (keys mode 600): the cluster's CA (ca.pem; keep ca.key off the workers: it
signs new members) and a certificate and key for the scheduler, the workers and the client.

On the head ({host}), the scheduler on the private interface, its dashboard on loopback only:
  dask scheduler --protocol tls --host {host} --port {DASK_PORT} \\
      --dashboard-address 127.0.0.1:8787 \\
      --tls-ca-file {f["ca.pem"]} --tls-cert {f["scheduler.pem"]} --tls-key {f["scheduler.key"]}

On each worker machine (copy ca.pem, worker.pem and worker.key there, the key mode 600):
  dask worker tls://{host}:{DASK_PORT} --nworkers 2 --nthreads 1 --no-dashboard \\
      --tls-ca-file ca.pem --tls-cert worker.pem --tls-key worker.key

In the run's params.yaml:
  cluster:
    address: tls://{host}:{DASK_PORT}
    security: {{ca_file: {f["ca.pem"]}, cert: {f["client.pem"]}, key: {f["client.key"]}}}
"""


def _token() -> str:
    return secrets.token_urlsafe(24)


def secret_files() -> list[str]:
    return [SERVER_ENV, LOOP_ENV, WORKER_ENV, PLAYER_ENV, ADMIN_ENV, AUTH_INI]


def make_secrets(folder: Path, host: str) -> Path:
    """Fresh random logins for the cluster, each in the file of the processes that need it
    (mode 600): MLflow's admin, the loop's user and the read-only player's; the Flask key of
    MLflow's login forms; Prefect's auth string; and the basic-auth configuration of
    `mlflow server`, whose user store lies in `folder` too."""
    folder = _private_folder(folder, [*secret_files(), "mlflow-auth.db"])
    admin, loop, player = _token(), _token(), _token()
    prefect = f"tengen:{_token()}"
    mlflow_url = f"http://{host}:{MLFLOW_PORT}"
    prefect_url = f"http://{host}:{PREFECT_PORT}/api"
    ini = folder / AUTH_INI
    files = {
        AUTH_INI: "\n".join(
            [
                "[mlflow]",
                "default_permission = READ",
                f"database_uri = sqlite:///{folder / 'mlflow-auth.db'}",
                f"admin_username = {ADMIN_USER}",
                f"admin_password = {admin}",
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
                "",
            ]
        ),
        SERVER_ENV: _env(
            {
                "MLFLOW_AUTH_CONFIG_PATH": str(ini),
                "MLFLOW_FLASK_SERVER_SECRET_KEY": _token(),
                "PREFECT_SERVER_API_AUTH_STRING": prefect,
            }
        ),
        LOOP_ENV: _env(
            {
                "MLFLOW_TRACKING_URI": mlflow_url,
                "MLFLOW_TRACKING_USERNAME": LOOP_USER,
                "MLFLOW_TRACKING_PASSWORD": loop,
                "PREFECT_API_URL": prefect_url,
                "PREFECT_API_AUTH_STRING": prefect,
            }
        ),
        WORKER_ENV: _env({"PREFECT_API_URL": prefect_url, "PREFECT_API_AUTH_STRING": prefect}),
        PLAYER_ENV: _env(
            {
                "MLFLOW_TRACKING_URI": mlflow_url,
                "MLFLOW_TRACKING_USERNAME": PLAYER_USER,
                "MLFLOW_TRACKING_PASSWORD": player,
            }
        ),
        ADMIN_ENV: _env(
            {
                "MLFLOW_TRACKING_URI": mlflow_url,
                "MLFLOW_TRACKING_USERNAME": ADMIN_USER,
                "MLFLOW_TRACKING_PASSWORD": admin,
            }
        ),
    }
    for file, text in files.items():
        _write_private(folder / file, text)
    return folder


def _env(values: dict[str, str]) -> str:
    """KEY=value lines that a shell's `.` and systemd's EnvironmentFile both read: each value
    quoted (a path may hold a space)."""
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in values.items())


def read_env(path: Path) -> dict[str, str]:
    """KEY=value lines of an environment file (`#` comments and blank lines skipped)."""
    out = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise ClusterError(f"{path} does not exist (`tengen cluster secrets` makes it)") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ClusterError(f"{path}:{number}: not a KEY=value line")
        try:
            words = shlex.split(value)
        except ValueError as e:
            raise ClusterError(f"{path}:{number}: {e}") from None
        out[key.strip().removeprefix("export ").strip()] = words[0] if words else ""
    return out


def _need(env: dict[str, str], keys: tuple[str, ...], path: Path) -> dict[str, str]:
    missing = [k for k in keys if not env.get(k)]
    if missing:
        raise ClusterError(f"{path} lacks {', '.join(missing)} (`tengen cluster secrets` "
                           "writes them)")  # fmt: skip
    return env


def secrets_howto(folder: Path, host: str) -> str:
    q = {name: shlex.quote(str(folder / name)) for name in secret_files()}
    try:
        ipaddress.ip_address(host)
        allowed = ""  # MLflow answers requests to a private address as they are
    except ValueError:  # a name: MLflow's host-header check must be told it
        allowed = f" --allowed-hosts {shlex.quote(f'{host},{host}:{MLFLOW_PORT}')}"
    return f"""\
Made in {folder} (each file mode 600; copy worker.env to the workers, player.env to players).

On the head ({host}), each server on the private interface, each in a terminal of its own (or
as a service):
  (set -a; . {q[SERVER_ENV]}; exec mlflow server --app-name basic-auth --host {host} \\
      --port {MLFLOW_PORT}{allowed} --backend-store-uri sqlite:///$HOME/mlflow/mlflow.db \\
      --artifacts-destination $HOME/mlflow/artifacts)
  (set -a; . {q[SERVER_ENV]}; exec prefect server start --host {host} --port {PREFECT_PORT})
Then, once, the loop's and the players' users:
  tengen cluster users {shlex.quote(str(folder))}
The loop (in a run folder made with `tengen run --preset NAME --repo DIR --make-only`):
  (set -a; . {q[LOOP_ENV]}; exec tengen run --repo DIR)
A player (in a clone of the run's git):
  (set -a; . {q[PLAYER_ENV]}; exec tengen gtp --model models:/tengen@champion --lineage CLONE)
"""


def make_users(folder: Path, *, experiment: str, model: str) -> list[str]:
    """On the tracking server of `folder`'s environment files: the loop's user and the
    player's (made, or their passwords set again from the files), and the experiment and
    registered model made by the loop's user, who thereby manages them (MANAGE) while every
    other user only reads them (the server's default_permission). Returns what it did."""
    from mlflow.exceptions import MlflowException

    # mlflow.server imports starlette's deprecated WSGI middleware: not this command's news.
    warnings.filterwarnings("ignore", module="mlflow.server")
    login = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    admin, loop, player = (
        _need(read_env(folder / name), (*login, "MLFLOW_TRACKING_URI"), folder / name)
        for name in (ADMIN_ENV, LOOP_ENV, PLAYER_ENV)
    )
    uri = admin["MLFLOW_TRACKING_URI"]
    done = []
    with _login(admin):
        from mlflow.server.auth.client import AuthServiceClient

        auth = AuthServiceClient(uri)
        for env in (loop, player):
            user, password = env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"]
            try:
                auth.get_user(user)
            except MlflowException:
                auth.create_user(user, password)
                done.append(f"made the user {user}")
            else:
                auth.update_user_password(user, password)
                done.append(f"set {user}'s password from {folder}")
    with _login(loop):
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            client.create_experiment(experiment)
            done.append(f"made the experiment {experiment!r} as {LOOP_USER}")
        try:
            client.create_registered_model(model)
            done.append(f"made the registered model {model!r} as {LOOP_USER}")
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
    with _login(admin):
        auth = AuthServiceClient(uri)
        exp = MlflowClient(uri).get_experiment_by_name(experiment)
        user = loop["MLFLOW_TRACKING_USERNAME"]
        for kind, rid in (("experiment", exp.experiment_id), ("registered_model", model)):
            # Its maker manages it: made by anyone but the loop's user, someone else could
            # write the run's records or move its champion.
            if auth.get_user_permission(user, kind, rid).permission != "MANAGE":
                what = f"experiment {experiment!r}" if kind == "experiment" else f"model {model!r}"
                raise ClusterError(
                    f"the {what} on {uri} was made by another user, who manages it; delete it "
                    "as the admin and run `tengen cluster users` again, or give the run another "
                    "name (--experiment, --model, and the run's mlflow section)"
                )
        done.append(f"{LOOP_USER} manages {experiment!r} and {model!r}; others read them")
    return done


class _login:
    """MLflow's login environment variables set to `env`'s for a block, then put back."""

    KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")

    def __init__(self, env: dict[str, str]):
        self.env = env

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.KEYS}
        for k in self.KEYS:
            os.environ[k] = self.env[k]

    def __exit__(self, kind, error, trace):
        from mlflow.exceptions import MlflowException

        from play.mlflow_store import said

        # Said while this login is still the one set, so that a refusal names its user.
        message = said(error) if isinstance(error, MlflowException) else None
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if message is not None:
            raise ClusterError(message) from None
