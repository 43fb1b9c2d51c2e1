"""`tengen engines`: KataGo installed from PyPI's katrain wheel and Debian's OpenCL on the CPU
(play/katago.py), found by the evaluation, and listed."""

from __future__ import annotations

from play import katago as K
from play.analysis import parse_config
from play.programs import install_command, which
from tests.conftest import run_cli


def test_installing_again_keeps_katago_playing_and_list_shows_it(katago):
    done = run_cli("engines", "install", "katago", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "downloading" not in done.stdout  # the program and the network are kept
    assert f"KataGo {katago.version()} in {katago.home}" in done.stdout
    assert f"GTP at 1 visit a move: {katago.gtp_command(visits=1)}" in done.stdout
    # It never tunes: the config reads the tuning file written beside it.
    config = parse_config(katago.gtp_config.read_text())
    assert (katago.home / "opencl-tune.txt").read_text() == K.TUNING.read_text()
    assert config["openclTunerFile"] == str(katago.home / "opencl-tune.txt")
    assert config["maxBoardSizeForNNBuffer"] == str(katago.board_size())
    listed = run_cli("engines", "list")
    assert listed.returncode == 0 and f"katago  {katago.version()}, 9x9: " in listed.stdout
    assert which("katago") == str(katago.program)
    assert install_command("katago") == "tengen engines install katago"


def test_an_unknown_engine_or_size_is_refused():
    for args, said in ((("leela",), "unknown engine 'leela'"),
                       (("katago", "--board-size", "25"), "within 2..19")):  # fmt: skip
        done = run_cli("engines", "install", *args)
        assert done.returncode == 2 and said in done.stderr, done.stderr
