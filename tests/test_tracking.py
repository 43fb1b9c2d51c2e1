"""stages.tracking against MLflow's real SQLite store: where runs go, how a stage's run ends,
and the clean-up of runs whose process died. (The whole record of a run, lineage included,
is checked by the loop and `dvc repro` tests.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from stages import shuffle, tracking, train
from stages.cli import InputError
from stages.spec import sections
from tests.conftest import REPO


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A folder with the repository's params.yaml, as the working folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    monkeypatch.delenv(tracking.ENV_PARENT, raising=False)
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    return tmp_path


def _settings(**change):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["mlflow"].update(change)
    return tracking.settings(raw, "params.yaml")


def test_the_store_is_the_workspace_s_unless_told_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = _settings()
    assert tracking.store_uri(params, tmp_path) == f"sqlite:///{tmp_path}/mlflow.db"
    absolute = _settings(tracking_uri="sqlite:////srv/runs.db")
    assert tracking.store_uri(absolute, tmp_path) == "sqlite:////srv/runs.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert tracking.store_uri(params, tmp_path) == "http://tracking:5000"
    assert tracking._artifact_location(f"sqlite:///{tmp_path}/mlflow.db") == (
        (tmp_path / "mlartifacts").as_uri()
    )
    assert _settings(enabled=False) is None


def test_an_experiment_registers_under_its_own_name(monkeypatch):
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    assert tracking.registered_model_name(_settings()) == "tengen"
    monkeypatch.setenv("DVC_EXP_NAME", "lr-low")
    assert tracking.registered_model_name(_settings()) == "tengen-lr-low"


def test_metrics_flatten_to_numbers():
    metrics = {"loss": {"total": 1.5, "policy": 2}, "passed": True, "net": "b2c16", "x": None}
    assert tracking.numeric(metrics) == {"loss.total": 1.5, "loss.policy": 2.0, "passed": 1.0}


def test_a_stage_run_nests_under_the_workspace_parent_and_records_failure(workspace):
    from mlflow import MlflowClient

    with tracking.stage_run("params.yaml", "shuffle", 3, sections=sections(shuffle.Params)) as run:
        run.log_metrics({"window_rows": 120, "files": 2})
        first = run.run_id
    # The fluent API's URI is put back: nothing leaks to later child processes.
    assert "MLFLOW_TRACKING_URI" not in os.environ
    with (
        pytest.raises(InputError),
        tracking.stage_run("params.yaml", "train", 3, sections=sections(train.Params)) as run,
    ):
        failed = run.run_id
        raise InputError("train: no window")
    client = MlflowClient(f"sqlite:///{workspace}/mlflow.db")
    done, broken = client.get_run(first), client.get_run(failed)
    assert done.info.status == "FINISHED" and broken.info.status == "FAILED"
    assert done.data.metrics["window_rows"] == 120
    assert done.data.params["shuffle.window_c"] == "25000"
    assert broken.data.params["loss.policy"] == "1.0"  # train logs the loss section too
    parent = done.data.tags["mlflow.parentRunId"]
    assert broken.data.tags["mlflow.parentRunId"] == parent
    assert client.get_run(parent).data.tags["tengen.launcher"] == "dvc"
    assert done.data.tags["tengen.generation"] == "3"
    experiment = client.get_experiment(done.info.experiment_id)
    assert experiment.artifact_location == (workspace / "mlartifacts").as_uri()
    # Marked as model training: MLflow 3's UI opens it on its runs, not its GenAI traces.
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_tracking_off_logs_nothing(workspace):
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["mlflow"]["enabled"] = False
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    with tracking.stage_run("params.yaml", "gate", 0, sections=("gate", "device")) as run:
        assert run is None
    assert not (workspace / "mlflow.db").exists()


def test_runs_of_dead_processes_are_closed_and_live_ones_kept(workspace):
    raw = yaml.safe_load((workspace / "params.yaml").read_text())
    tracker = tracking.open_tracker(raw, "params.yaml")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        runs = {}
        for name, pid in (("dead", dead), ("live", str(live.pid)), ("self", str(os.getpid()))):
            tags = {**tracker.workspace_tags, "tengen.pid": pid}
            runs[name] = tracker.client.create_run(tracker.experiment_id, tags=tags).info.run_id
        assert tracker.close_dead_runs() == 1
        status = {k: tracker.client.get_run(v).info.status for k, v in runs.items()}
        assert status == {"dead": "KILLED", "live": "RUNNING", "self": "RUNNING"}
    finally:
        live.kill()
        live.wait()


def test_an_ablation_finds_a_candidate_registered_before_it(workspace, monkeypatch):
    """Under `dvc exp run -S gate....` only gate and promote rerun: the candidate was
    registered under the main name, and promote copies it into the experiment's model."""
    raw = yaml.safe_load((workspace / "params.yaml").read_text())
    tracker = tracking.open_tracker(raw, "params.yaml")
    (workspace / "model").mkdir()
    tracker.client.create_registered_model("tengen")
    version = tracker.client.create_model_version("tengen", (workspace / "model").as_uri())
    tracker.client.set_model_version_tag("tengen", version.version, "tengen.sha256", "abc")
    assert tracker.version_of("abc").version == version.version
    assert tracker.version_of("def") is None
    monkeypatch.setenv("DVC_EXP_NAME", "gateoff")
    ablation = tracking.open_tracker(raw, "params.yaml")
    copied = ablation.version_of("abc")
    assert copied.name == "tengen-gateoff" and copied.tags["tengen.sha256"] == "abc"
    assert ablation.version_of("abc").version == copied.version  # found, not copied again


def test_a_deleted_experiment_is_named_not_a_traceback(workspace):
    raw = yaml.safe_load((workspace / "params.yaml").read_text())
    tracker = tracking.open_tracker(raw, "params.yaml")
    tracker.client.delete_experiment(tracker.experiment_id)
    with pytest.raises(tracking.ParamsError, match="'tengen' is deleted.*restore it"):
        tracking.open_tracker(raw, "params.yaml")


def test_an_experiment_made_before_the_kind_tag_gets_it(workspace):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workspace}/mlflow.db")
    old = client.create_experiment("tengen")
    raw = yaml.safe_load((workspace / "params.yaml").read_text())
    assert tracking.open_tracker(raw, "params.yaml").experiment_id == old
    tags = client.get_experiment(old).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_model_fetched_from_a_named_store_leaves_the_process_s_store_alone(
    tmp_path, monkeypatch, tiny_model
):
    """`tengen gtp --model models:/...` and the tests fetch from a store given by URI; the
    process's own tracking URI (which every later stage in it logs to) must not move."""
    import mlflow
    from mlflow import MlflowClient

    from play.models import ModelError, resolve

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/store.db"
    client = MlflowClient(uri, registry_uri=uri)
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(experiment)
    client.log_artifact(run.info.run_id, str(tiny_model), "champion")
    client.create_registered_model("tengen")
    version = client.create_model_version("tengen", f"runs:/{run.info.run_id}/champion",
                                          run.info.run_id)  # fmt: skip
    client.set_registered_model_alias("tengen", "champion", version.version)
    default = mlflow.get_tracking_uri()

    fetched = resolve("models:/tengen@champion", tracking_uri=uri)
    assert fetched.read_bytes() == tiny_model.read_bytes()
    assert "MLFLOW_TRACKING_URI" not in os.environ and mlflow.get_tracking_uri() == default
    with pytest.raises(ModelError, match=f"not fetched from the MLflow store {uri}"):
        resolve("models:/tengen@candidate", tracking_uri=uri)
    assert "MLFLOW_TRACKING_URI" not in os.environ
