"""Shared fixtures: GNU Go (skipped with a how-to if absent, required in CI), position builders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The CUDA kernels run in numba's CUDA simulator unless a real GPU run is asked for with
# TENGEN_GPU=1 (then tests marked `gpu` run too). Decided here, before numba is imported.
if not os.environ.get("TENGEN_GPU"):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI (.ci/run sets CI) draws the same examples every time, so that a submission lands or not
# on its own change; elsewhere each run draws new ones and finds what CI's do not (pin one
# with --hypothesis-seed). Hypothesis's advice for CI.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

from gocore.board import BLACK, WHITE  # noqa: E402
from gocore.rules import PRESETS, Rules  # noqa: E402
from play.game import Game  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# Real game records (from ../shared/data/sgf, copied here so that a bare checkout has them).
SHARED_SGF = REPO / "tests" / "data" / "sgf"

GNUGO_HOWTO = "GNU Go 3.8 is not installed: apt-get install -y gnugo (it lands in /usr/games)"


def find_gnugo() -> str | None:
    return shutil.which("gnugo") or shutil.which("gnugo", path="/usr/games")


@pytest.fixture(scope="session")
def gnugo_path() -> str:
    path = find_gnugo()
    if path is None:
        # CI installs GNU Go; there a missing binary is a failure, not a skip.
        if os.environ.get("TENGEN_REQUIRE_GNUGO"):
            pytest.fail(GNUGO_HOWTO)
        pytest.skip(GNUGO_HOWTO)
    return path


KATAGO_HOWTO = "KataGo is not installed: tengen engines install katago"


@pytest.fixture(scope="session")
def katago():
    """The installed KataGo (play.katago.Installed), made by `tengen engines install katago`."""
    from play.katago import installed

    found = installed()
    if found is None:
        if os.environ.get("TENGEN_REQUIRE_KATAGO"):  # CI installs it: missing is a failure
            pytest.fail(KATAGO_HOWTO)
        pytest.skip(KATAGO_HOWTO)
    return found


CHROMIUM_HOWTO = "Chromium is not installed: apt-get install -y chromium (a headless browser)"


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("TENGEN_REQUIRE_CHROMIUM"):  # CI installs it: missing is a failure
            pytest.fail(CHROMIUM_HOWTO)
        pytest.skip(CHROMIUM_HOWTO)
    return path


def _chromium(chromium: str, *network: str) -> list[str]:
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        *network,
        "--virtual-time-budget=20000",
        f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-')}",
    ]


def render_local(chromium: str, url: str) -> str:
    """The DOM of a page served on this machine (http://127.0.0.1:PORT/...) after its scripts
    ran in headless Chromium, every other host unreachable."""
    args = _chromium(chromium, "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    result = subprocess.run([*args, "--dump-dom", url], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0 and "<body" in result.stdout, result.stderr[-2000:]
    return result.stdout


def render_offline(chromium: str, page: Path, screenshot: Path | None = None) -> str:
    """The page's DOM after its scripts ran in headless Chromium with the network off (every
    host resolves to nothing and every request goes to a closed proxy), as a person would see
    it on a machine without internet."""
    args = _chromium(
        chromium, "--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"
    )
    if screenshot is not None:
        subprocess.run(
            [
                *args,
                "--window-size=1300,3000",
                f"--screenshot={screenshot}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            timeout=120,
        )
    result = subprocess.run(
        [*args, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "<body" in result.stdout, result.stderr[-2000:]
    return result.stdout


VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}


def drawn_charts(dom: str) -> dict[str, int]:
    """Each chart of a rendered page (an element vegaEmbed drew into, by its id) and how many
    data marks its SVG holds: the paths, lines, rects and symbols of vega's mark groups
    (class role-mark), not axes, legends or titles. 0: the chart's frame is there, its data
    is not."""
    import html.parser

    class Charts(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack: list[tuple[str | None, bool]] = []  # (chart id, in a mark group)
            self.marks: dict[str, int] = {}

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            classes = (attrs.get("class") or "").split()
            chart, in_mark = self.stack[-1] if self.stack else (None, False)
            if "vega-embed" in classes:
                chart = attrs.get("id") or f"chart {len(self.marks)}"
                self.marks.setdefault(chart, 0)
            if chart and in_mark and tag in ("path", "line", "rect", "circle"):
                self.marks[chart] += attrs.get("d", "x") != ""
            if tag == "g":
                in_mark = "role-mark" in classes
            if tag not in VOID:
                self.stack.append((chart, in_mark))

        def handle_endtag(self, tag):
            if self.stack and tag not in VOID:
                self.stack.pop()

    parser = Charts()
    parser.feed(dom)
    return parser.marks


def tengen_command() -> str:
    """How tests start our own GTP engine: this interpreter, the real CLI module."""
    return f"{sys.executable} -m flows.cli gtp"


def run_cli(
    *args: str, input: str | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def game_from_diagram(
    diagram: str, rules: Rules | str = "tromp-taylor", to_move: int = BLACK
) -> Game:
    """A Game set up from rows of `.`, `X` (black), `O` (white); y = 0 is the first row."""
    rows = [row.split() for row in diagram.strip().splitlines()]
    size = len(rows)
    assert all(len(row) == size for row in rows), "the diagram must be square"
    game = Game(size, PRESETS[rules] if isinstance(rules, str) else rules)
    for colour, mark in ((BLACK, "X"), (WHITE, "O")):
        points = [
            (x, y) for y, row in enumerate(rows) for x, cell in enumerate(row) if cell == mark
        ]
        if points:
            game.add_setup_stones(colour, points)
    game.set_to_move(to_move)
    return game


def diagram_of(game: Game) -> str:
    return "\n".join(" ".join(".XO"[c] for c in row) for row in game.board())


def ko_position(rules: str) -> Game:
    """Black takes a ko by playing C4, capturing the white stone at B4."""
    return game_from_diagram(
        """
        . X O . .
        X O . O .
        . X O . .
        . . . . .
        . . . . .
        """,
        rules=rules,
    )


def triple_ko_game(rules: str) -> Game:
    # Three kos, stacked; in the top and bottom ones Black can take, in the middle one White.
    return game_from_diagram(
        """
        . X O . . . . . .
        X O . O . . . . .
        . X O . . . . . .
        . O X . . . . . .
        O X . X . . . . .
        . O X . . . . . .
        . X O . . . . . .
        X O . O . . . . .
        . X O . . . . . .
        """,
        rules=rules,
    )


TRIPLE_KO_CYCLE = [
    (BLACK, (2, 1)),  # takes the top ko
    (WHITE, (2, 4)),  # takes the middle ko
    (BLACK, (2, 7)),  # takes the bottom ko
    (WHITE, (1, 1)),  # retakes the top ko (legal: the ban ended with the next move)
    (BLACK, (1, 4)),  # retakes the middle ko
    (WHITE, (1, 7)),  # retakes the bottom ko: the starting position, Black to move again
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A random-init b2c16 checkpoint (model id "tiny"): a real net for quick self-play."""
    import torch

    from nets import checkpoint
    from nets.config import net_config
    from nets.model import GoNet

    torch.manual_seed(0)
    net = GoNet(net_config("b2c16"))
    return checkpoint.save(net, tmp_path_factory.mktemp("model") / "b2c16.pt", {"model_id": "tiny"})


# What redirects a later MLflow call in this process or its children to another store or run.
MLFLOW_WHERE = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_NAME",
                "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")  # fmt: skip


@pytest.fixture(autouse=True)
def _mlflow_store_is_left_alone():
    """A test (or the code it runs in-process) that leaves the MLflow store or run in the
    environment changed fails, and the variables are put back: mlflow.set_tracking_uri
    exports MLFLOW_TRACKING_URI, and every later test's stages would then log to a store
    that is gone (CI once failed six unrelated tests that way)."""
    before = {k: os.environ.get(k) for k in MLFLOW_WHERE}
    yield
    changed = [k for k in MLFLOW_WHERE if os.environ.get(k) != before[k]]
    for key in changed:
        if before[key] is None:
            del os.environ[key]
        else:
            os.environ[key] = before[key]
    if changed:
        pytest.fail(f"the test left the environment changed: {', '.join(changed)}")


@pytest.fixture(scope="session")
def prefect_api():
    """Prefect's local API on a temporary database, for the whole session (it takes a few
    seconds to start; Prefect's own test harness)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def selfplay_generations(tmp_path_factory) -> Path:
    """Three generations of real self-play shards (5x5, uniform priors, few visits):
    gen-0, gen-1, gen-2 under the returned folder."""
    import yaml

    from stages import selfplay
    from stages.params import load_params

    root = tmp_path_factory.mktemp("selfplay")
    params = load_params(REPO / "params.yaml")
    params["selfplay"].update(
        games=4, slots=4, full_visits=3, cheap_visits=2, decided_visits=2,
        board_sizes={5: 1.0}, rows_per_shard=15, record_cheap_searches=True,
    )  # fmt: skip
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    for gen in range(3):
        p, io = selfplay.prepare(
            path, gen, model="uniform", out=root / f"gen-{gen}", metrics=root / "m.json"
        )
        selfplay.run(p, io, progress=False)
    return root


def run_in(repo: Path, *cmd: str, check: bool = True) -> str:
    """A command in `repo` with this environment's bin first on PATH (dvc, python)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    if check:
        assert result.returncode == 0, f"{cmd}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result.stdout


def make_run_repo(
    repo: Path,
    *,
    code_deps: bool,
    win_fraction: float = 0.5,
    grow: list | None = None,
    evaluate_every: int = 0,
) -> Path:
    """A git repository with DVC holding a tiny two-generation run (5x5 boards, b2c16);
    win_fraction 0 promotes every candidate; `grow` is run.grow; with evaluate_every, an
    evaluate stage on that schedule (2 games each against GNU Go level 0 and the random
    player: GNU Go must be installed)."""
    import yaml

    from flows import pipeline
    from stages.params import load_params

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo.mkdir(parents=True)
    params = load_params(REPO / "params.yaml")
    params["run"]["generations"] = 2
    params["run"]["grow"] = grow or []
    params["selfplay"].update(games=4, slots=4, full_visits=8, cheap_visits=2, decided_visits=2,
                              board_sizes={5: 1.0})  # fmt: skip
    params["shuffle"].update(window_c=100, rows_per_file=50)
    params["train"].update(net="b2c16", tensor=5, batch_size=16, samples_per_generation=64,
                           warmup_samples=0, threads=1)  # fmt: skip
    params["ema"].update(bn_batches=1, bn_batch_size=16)
    params["gate"].update(
        games=2, slots=2, visits=4, board_size=5, komi=0.5, win_fraction=win_fraction
    )
    params["evaluate"].update(
        every=evaluate_every, games=2, board_size=5, komi=0.5, visits=4, past_champions=1,
        opponents={"gnugo-0": "gnugo --mode gtp --level 0 --chinese-rules",
                   "random": "{tengen} gtp --player random --seed 1"},
        anchor="gnugo-0",
    )  # fmt: skip
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    (repo / ".gitignore").write_text("mlflow.db\nmlartifacts/\n")
    pipeline.write_dvc_yaml(repo / "params.yaml", repo / "dvc.yaml", code_deps=code_deps)
    run_in(repo, "git", "init", "-q")
    run_in(repo, "git", "config", "user.email", "ci@tengen")
    run_in(repo, "git", "config", "user.name", "ci")
    run_in(repo, "dvc", "init", "-q")
    run_in(repo, "git", "add", "-A")
    run_in(repo, "git", "commit", "-qm", "run")
    return repo


def default_section(name: str):
    """A section of the repository's params.yaml (where every default lives), validated."""
    from stages import params as P

    models = {
        "selfplay": P.SelfPlayParams, "shuffle": P.ShuffleParams, "train": P.TrainParams,
        "loss": P.LossParams, "ema": P.EmaParams, "gate": P.GateParams,
        "evaluate": P.EvaluateParams, "mlflow": P.MlflowParams, "run": P.RunParams,
    }  # fmt: skip
    return P.section(P.load_params(REPO / "params.yaml"), name, models[name], source="params.yaml")


# A match search's root keys (stages.params.MatchSearchSection): a PUCT root.
PUCT_ROOT = {"root": "puct", "gumbel_considered": 16, "gumbel_c_visit": 50.0, "gumbel_c_scale": 0.1}


def search_params(**changes):
    """params.yaml's self-play search knobs (gocore.search.SearchParams), with `changes`."""
    return default_section("selfplay").search.params()._replace(**changes)


def loss_weights():
    """params.yaml's loss weights (nets.losses.LossWeights)."""
    return default_section("loss").weights()


# Every test has a kind (`pytest -m property`, `-m "not e2e"`): by its file, or, for a
# hypothesis test anywhere, property; a test that plays GNU Go is differential.
KINDS = {
    "test_cuda.py": "cuda",
    "test_gnugo_differential.py": "differential",
    "test_loop.py": "e2e",
    "test_pipeline.py": "e2e",
    "test_runs.py": "e2e",
    "test_reliability.py": "e2e",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        kind = KINDS.get(item.path.name, "unit")
        if getattr(item.obj, "is_hypothesis_test", False):
            kind = "property"
        elif kind == "unit" and (
            "gnugo_path" in getattr(item, "fixturenames", ()) or item.get_closest_marker("gnugo")
        ):
            kind = "differential"
        item.add_marker(getattr(pytest.mark, kind))
