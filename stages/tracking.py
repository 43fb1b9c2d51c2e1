"""MLflow tracking: every stage run is an MLflow run, logged by the stage itself, so that
`dvc repro` and `tengen run` leave the same record.

- The store: params.yaml `mlflow.tracking_uri` (default `sqlite:///mlflow.db`, a relative
  path taken from the DVC root, so `dvc exp run --temp` logs to the workspace's store) or
  the MLFLOW_TRACKING_URI environment variable (a tracking server, on a cluster). Artifacts
  of a SQLite store go to `mlartifacts/` beside it.
- One parent run per loop: `tengen run` makes one and hands its id to the stages through
  TENGEN_MLFLOW_PARENT; without it (`dvc repro`, `dvc exp run`, a stage by hand) the stages
  share one parent per workspace and experiment name, found by its tag.
- One nested run per stage per generation, named `<stage>-<N>`, with its params.yaml
  sections as params, its metrics, and tags that give its lineage by content: a self-play
  run's model and data digests, a window's digest and the self-play runs it draws from, a
  candidate's checkpoint digest. A stage skipped by DVC (up to date) logs nothing new; its
  older run is still found by those digests.
- Candidates are logged as models and registered (`mlflow.registered_model`, with the DVC
  experiment's name appended under `dvc exp run`), with aliases `candidate` (the newest) and
  `champion` (set by promote).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gocore.atomic import sha256_file
from play.mlflow_store import tracking_uri_for
from stages.layout import MANIFEST
from stages.params import USERINFO, MlflowParams, ParamsError, load_params, section

ENV_PARENT = "TENGEN_MLFLOW_PARENT"
UNIFORM = "uniform"


def settings(raw: dict, source: str | Path) -> MlflowParams | None:
    """The `mlflow:` section, or None when tracking is off (`enabled: false`)."""
    params = section(raw, "mlflow", MlflowParams, source=source)
    return params if params.enabled else None


def root() -> Path:
    """The workspace the relative store path is taken from: DVC's root for a stage that DVC
    runs (the parent repository for a queued `dvc exp run`), else the working folder."""
    return Path(os.environ.get("DVC_ROOT") or ".").resolve()


def store_uri(params: MlflowParams, base: Path) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or params.tracking_uri
    if USERINFO.match(uri):  # params.yaml's was checked when read
        raise ParamsError(
            "MLFLOW_TRACKING_URI: a URI with a password in it would be logged; give it "
            "without it and the login in MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD (docs/cluster.md)"
        )
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        uri = prefix + str(base / uri[len(prefix) :])
    return uri


def _artifact_location(uri: str) -> str | None:
    prefix = "sqlite:///"
    if uri.startswith(prefix):
        return (Path(uri[len(prefix) :]).parent / "mlartifacts").as_uri()
    return None


def registered_model_name(params: MlflowParams) -> str:
    """`mlflow.registered_model`, plus `-<name>` inside a DVC experiment, so that an
    ablation's aliases never move the main run's champion."""
    exp = os.environ.get("DVC_EXP_NAME")
    return f"{params.registered_model}-{exp}" if exp else params.registered_model


# The experiment's kind for MLflow's own use (the UI's ExperimentKind enum); MLflow 3.17's UI
# opens an experiment on its GenAI overview all the same, so links go to runs_url().
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}

LOCAL_UI = "http://127.0.0.1:5000"  # where `tengen ui` serves a run folder's store


def ui_of(uri: str, local: str = LOCAL_UI) -> str:
    """The MLflow UI of a store: a tracking server is its own; a local store's is `local`."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else local


def runs_url(ui: str, experiment_id: str) -> str:
    """An experiment's training runs in the UI (its bare page is the GenAI overview)."""
    return f"{ui}/#/experiments/{experiment_id}/runs"


def run_url(ui: str, experiment_id: str, run_id: str) -> str:
    return f"{ui}/#/experiments/{experiment_id}/runs/{run_id}"


def compare_url(ui: str, experiment_id: str, run_ids: list[str]) -> str:
    """The UI's side-by-side view of runs (an ablation's arms): their metrics in one chart."""
    from urllib.parse import quote

    runs, experiments = json.dumps(run_ids), json.dumps([experiment_id])
    return f"{ui}/#/compare-runs?runs={quote(runs)}&experiments={quote(experiments)}"


def store_exists(uri: str) -> bool:
    """False for a SQLite store not made yet (reading it would make it); True otherwise."""
    return not uri.startswith("sqlite:///") or Path(uri[len("sqlite:///") :]).is_file()


@contextlib.contextmanager
def answering_quickly() -> Iterator[None]:
    """A store that is only read for a page or a link: one short try at a tracking server
    that does not answer, not MLflow's minutes of retries; and no telemetry."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    saved = {k: os.environ.get(k) for k in quick}
    os.environ.update({k: v for k, v in quick.items() if saved[k] is None})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)


def experiment_id_of(params: MlflowParams, base: Path) -> str | None:
    """The id of the run's experiment in its store, read only (None: no store or experiment
    yet, or a store that does not answer)."""
    uri = store_uri(params, base)
    if not store_exists(uri):
        return None
    try:
        with answering_quickly():
            from mlflow import MlflowClient

            found = MlflowClient(uri).get_experiment_by_name(params.experiment)
    except Exception:  # noqa: BLE001 - a link is a courtesy: without it the line says less
        return None
    return found.experiment_id if found is not None else None


def experiment(client, name: str, uri: str) -> str:
    """The id of the experiment `name` in the store, made (tagged as model training, with its
    artifacts beside a SQLite store) if it does not exist yet."""
    import mlflow

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(
                name, artifact_location=_artifact_location(uri), tags=EXPERIMENT_KIND
            )
        except mlflow.exceptions.MlflowException:  # made by another process meanwhile
            exp = client.get_experiment_by_name(name)
    if exp.lifecycle_stage == "deleted":
        raise ParamsError(
            f"mlflow.experiment: {name!r} is deleted in {uri}; restore it (mlflow experiments "
            f"restore --experiment-id {exp.experiment_id}) or name another"
        )
    if not set(EXPERIMENT_KIND) <= set(exp.tags):  # made before tengen tagged them
        for key, value in EXPERIMENT_KIND.items():
            client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def workspace_key(base: Path) -> str:
    """The tag value that marks a workspace's runs (from its absolute path)."""
    return hashlib.sha256(str(base).encode()).hexdigest()[:16]


class Tracker:
    """An MLflow store and experiment, opened for one workspace."""

    def __init__(self, params: MlflowParams, base: Path):
        # MLflow's usage telemetry is off unless asked for (a training run should not phone
        # home); MLFLOW_DISABLE_TELEMETRY=false turns it on.
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        import mlflow

        self.params = params
        self.base = base
        self.uri = store_uri(params, base)
        self.client = mlflow.MlflowClient(self.uri)
        self.model_name = registered_model_name(params)
        self.experiment_id = experiment(self.client, params.experiment, self.uri)

    @property
    def workspace_tags(self) -> dict[str, str]:
        """Where and by which process a run is made (to close it if that process dies)."""
        return {
            "tengen.workspace": str(self.base),
            "tengen.workspace_key": workspace_key(self.base),
            "tengen.host": socket.gethostname(),
            "tengen.pid": str(os.getpid()),
        }

    def close_dead_runs(self) -> int:
        """Mark KILLED the runs of this workspace still RUNNING whose process on this host
        is gone (a loop or stage killed from outside). Returns how many."""
        import psutil

        tags = self.workspace_tags
        closed = 0
        for run in self.runs(
            f"tags.`tengen.workspace_key` = '{tags['tengen.workspace_key']}'"
            " and attributes.status = 'RUNNING'",
            max_results=1000,
        ):
            run_tags = run.data.tags
            if run_tags.get("tengen.host") != tags["tengen.host"]:
                continue
            pid = int(run_tags.get("tengen.pid", "0") or 0)
            if pid == os.getpid() or (pid and psutil.pid_exists(pid)):
                continue
            self.client.set_terminated(run.info.run_id, "KILLED")
            closed += 1
        return closed

    def runs(self, filter_string: str, max_results: int = 100) -> list:
        return self.client.search_runs(
            [self.experiment_id],
            filter_string,
            max_results=max_results,
            order_by=["attributes.start_time DESC"],
        )

    def workspace_parent(self) -> str:
        """The parent run of stages run outside a loop: one per workspace and DVC experiment,
        found by its tag, made on first use."""
        exp = os.environ.get("DVC_EXP_NAME")
        label = f"dvc exp {exp}" if exp else "dvc repro"
        key = hashlib.sha256(f"{label}\0{self.base}".encode()).hexdigest()[:16]
        found = self.runs(f"tags.`tengen.loop` = '{key}'", max_results=1)
        if found:
            return found[0].info.run_id
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{label} ({self.base.name})",
            tags={
                "tengen.loop": key,
                "tengen.launcher": "dvc",
                **self.workspace_tags,
                **_git_tags(self.base),
            },
        )
        self.client.set_terminated(run.info.run_id)
        return run.info.run_id

    def start_loop(self, name: str, tags: dict[str, str], resume: bool = False) -> str:
        """A loop's run: a new one, or with `resume` this workspace's latest loop run made
        RUNNING again by this process, its host and pid tags this process's (one run over the
        loops that grow a run a generation at a time, as an ablation's arms do). Returns its
        id."""
        if resume:
            found = self.runs(
                "tags.`tengen.launcher` = 'tengen run' and "
                f"tags.`tengen.workspace_key` = '{self.workspace_tags['tengen.workspace_key']}'",
                max_results=1,
            )
            if found:
                run_id = found[0].info.run_id
                self.client.update_run(run_id, status="RUNNING")
                for key, value in {**tags, **self.workspace_tags}.items():  # host, pid: ours
                    self.client.set_tag(run_id, key, value)
                return run_id
        key = hashlib.sha256(os.urandom(16)).hexdigest()[:16]
        run = self.client.create_run(
            self.experiment_id,
            run_name=name,
            tags={
                "tengen.loop": key,
                "tengen.launcher": "tengen run",
                **self.workspace_tags,
                **_git_tags(self.base),
                **tags,
            },
        )
        return run.info.run_id

    def model_versions(self, any_model: bool = False, **tags: str) -> list:
        """Registered versions of this run's model (of any model with `any_model`) with
        these tag values, newest first."""
        where = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        if not any_model:
            where = f"name = '{self.model_name}' and {where}"
        found = self.client.search_model_versions(where)
        return sorted(found, key=lambda v: int(v.creation_timestamp), reverse=True)

    def version_of(self, digest: str):
        """This run's registered version of the checkpoint with this SHA-256; one registered
        under another name (an ablation's `dvc exp run` whose ema stage DVC did not rerun)
        is copied into this name. None if the checkpoint was never logged."""
        own = self.model_versions(**{"tengen.sha256": digest})
        if own:
            return own[0]
        other = self.model_versions(any_model=True, **{"tengen.sha256": digest})
        if not other:
            return None
        source = other[0]
        copy = self.client.copy_model_version(
            f"models:/{source.name}/{source.version}", self.model_name
        )
        for key, value in source.tags.items():
            self.client.set_model_version_tag(self.model_name, copy.version, key, value)
        return self.client.get_model_version(self.model_name, copy.version)


def _git_tags(base: Path) -> dict[str, str]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=base, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"mlflow.source.git.commit": commit} if commit else {}


def open_tracker(raw: dict, source: str | Path) -> Tracker | None:
    params = settings(raw, source)
    return Tracker(params, root()) if params is not None else None


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def numeric(data: dict) -> dict[str, float]:
    """The numbers of a (nested) metrics dict, flattened; booleans as 0/1."""
    return {
        k: float(v)
        for k, v in flatten(data).items()
        if isinstance(v, int | float) and not (isinstance(v, float) and v != v)
    }


class StageRun:
    """One stage's MLflow run (the active fluent run while the stage works)."""

    def __init__(self, tracker: Tracker, run_id: str):
        self.tracker = tracker
        self.run_id = run_id

    @property
    def client(self):
        return self.tracker.client

    def log_metrics(self, metrics: dict, step: int = 0) -> None:
        import mlflow

        values = numeric(metrics)
        if values:
            mlflow.log_metrics(values, step=step)

    def tag(self, tags: dict[str, Any]) -> None:
        import mlflow

        mlflow.set_tags({k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        import mlflow

        path = Path(path)
        if path.is_dir():
            mlflow.log_artifacts(str(path), artifact_path)
        elif path.is_file():
            mlflow.log_artifact(str(path), artifact_path)

    def log_window(self, window: Path, manifest: dict, context: str) -> None:
        """The window as this run's input dataset: its files' digest, rows and source."""
        import mlflow
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        source = resolve_dataset_source(window.resolve().as_uri())
        dataset = MetaDataset(
            source=source,
            name=f"window-gen-{manifest.get('generation')}",
            digest=str(manifest.get("digest", ""))[:36],
        )
        mlflow.log_input(
            dataset,
            context=context,
            tags={
                "rows": str(manifest.get("window_rows")),
                "total_rows": str(manifest.get("total_rows")),
                "sha256": str(manifest.get("digest")),
            },
        )


@contextlib.contextmanager
def stage_run(
    params_path: str | Path,
    stage: str,
    generation: int,
    net: str | None = None,
    *,
    sections: tuple[str, ...] = (),
) -> Iterator[StageRun | None]:
    """The stage's MLflow run (None when tracking is off), named like its DVC stage
    (`<stage>-<N>`, `<stage>-<net>-<N>` for a grown net): FINISHED when the block ends,
    FAILED when it raises."""
    raw = load_params(params_path)
    tracker = open_tracker(raw, params_path)
    if tracker is None:
        yield None
        return
    import mlflow

    parent = os.environ.get(ENV_PARENT) or tracker.workspace_parent()
    params = {}
    for name in sections:
        value = raw.get(name)
        params.update(flatten(value, f"{name}.") if isinstance(value, dict) else {name: value})
    tracker.close_dead_runs()
    tags = {
        "tengen.stage": stage,
        "tengen.generation": str(generation),
        **({"tengen.net": net} if net else {}),
        **tracker.workspace_tags,
        **_git_tags(tracker.base),
    }
    if os.environ.get("DVC_STAGE"):
        tags["tengen.dvc_stage"] = os.environ["DVC_STAGE"]
    if os.environ.get("DVC_EXP_NAME"):
        tags["tengen.dvc_exp"] = os.environ["DVC_EXP_NAME"]
    with (
        tracking_uri_for(tracker.uri),
        mlflow.start_run(
            experiment_id=tracker.experiment_id,
            run_name=f"{stage}-{net}-{generation}" if net else f"{stage}-{generation}",
            parent_run_id=parent,
            tags=tags,
        ) as run,
    ):
        if params:
            mlflow.log_params({k: json.dumps(v) if isinstance(v, dict | list) else v
                               for k, v in params.items()})  # fmt: skip
        try:
            yield StageRun(tracker, run.info.run_id)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (stages.cli): stopped, not failed
            mlflow.end_run("KILLED")
            raise


def data_digest(folder: Path) -> str:
    """A self-play generation's identity: the SHA-256 of its shards' names and digests, in
    name order. The digests come from the folder's manifest where it has one (self-play's
    stage wrote it, and the shuffle checks it), instead of hashing every shard again."""
    manifest = Path(folder) / MANIFEST
    if manifest.exists():
        files = json.loads(manifest.read_text())["files"]
        digests = {f["name"]: f["sha256"] for f in files}
    else:
        digests = {p.name: sha256_file(p) for p in Path(folder).glob("part-*.parquet")}
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}\0{digests[name]}\n".encode())
    return h.hexdigest()


def model_digest(model: Path | None) -> str:
    """A model's identity: its checkpoint's SHA-256 ("uniform" for uniform priors)."""
    return sha256_file(model) if model is not None else UNIFORM
