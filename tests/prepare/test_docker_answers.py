"""Every answer docker can give about an image, fed to every launcher call that asks
(docs/assets.md, "Errors are not absence"; launcher/prepare/dockercli.py).

`docker image inspect` exits 1 both for a missing image and for a docker that cannot be asked.
The promise: only docker's own "no such image" (either wording) means absent; a dead daemon, a
socket that is not ours, a hung daemon, an answer that is not JSON, a missing docker binary are
failures (InfraError, exit 3), never "not here". A stand-in `docker` answers each kind as the
real CLI prints it (the two absent wordings are those docker 28 and older CLIs print), and each
caller is run: the reading itself, prepare's choice of a rows builder (absent: asks or refuses;
a failure: says so, and offers no 20 GB pull), and the image build's reading of the recipe
image's layers (absent: pulls it; a failure: stops, pulls nothing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.cli import SEED

from launcher.errors import BadInput, InfraError
from launcher.inputs.recipe import load_recipe
from launcher.prepare import assets as prep
from launcher.prepare import dockercli
from launcher.prepare import image as img

LAYERS = ["sha256:" + "a" * 64]
RECIPE = load_recipe(SEED)  # read before PATH holds only the stand-in (its run block is bash -n'd)
ANSWERS = {
    # kind: (exit code, stdout, stderr, sleep seconds)
    "present": (0, json.dumps(LAYERS), "", 0),
    "absent": (1, "", "Error: No such image: radixark/miles@sha256:x", 0),
    "absent-daemon": (
        1,
        "",
        "Error response from daemon: no such image: x: No such image: x",
        0,
    ),
    "daemon-down": (
        1,
        "",
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?",
        0,
    ),
    "socket-not-ours": (
        1,
        "",
        "permission denied while trying to connect to the Docker daemon socket at "
        "unix:///var/run/docker.sock: connect: permission denied",
        0,
    ),
    "hung": (0, json.dumps(LAYERS), "", 5),
    "not-json": (0, "<html>proxy</html>", "", 0),
    "no-docker": None,
}
ABSENT = {"absent", "absent-daemon"}

FAKE = """#!{python}
import json, sys, time
open({log!r}, "a").write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:2] == ["pull"]:
    sys.exit(0)
code, out, err, pause = {answer!r}
time.sleep(pause)
sys.stdout.write(out)
sys.stderr.write(err)
sys.exit(code)
"""


@pytest.fixture
def docker(tmp_path, monkeypatch, request):
    """A stand-in docker on PATH answering KIND; its calls logged."""
    kind = request.param
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "docker-calls.jsonl"
    log.touch()
    path = bin_dir / "docker"
    if ANSWERS[kind] is not None:
        path.write_text(FAKE.format(python=sys.executable, log=str(log), answer=ANSWERS[kind]))
        path.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(dockercli, "TIMEOUT_S", 1.0)
    return kind, str(path), log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


KINDS = sorted(ANSWERS)


@pytest.mark.parametrize("docker", KINDS, indirect=True)
def test_the_reading(docker):
    kind, path, _ = docker
    if kind == "present":
        assert dockercli.inspect("r@d", "{{json .RootFS.Layers}}", docker=path) == LAYERS
    elif kind in ABSENT:
        assert dockercli.inspect("r@d", "{{json .RootFS.Layers}}", docker=path) is None
    else:
        with pytest.raises(InfraError) as err:
            dockercli.inspect("r@d", "{{json .RootFS.Layers}}", docker=path)
        assert "docker image inspect r@d" in str(err.value)


@pytest.mark.parametrize("docker", KINDS, indirect=True)
def test_prepare_choosing_where_to_build_the_rows(docker, tmp_path, monkeypatch):
    kind, _, log = docker
    monkeypatch.setattr(prep, "_miles_here", lambda: False)
    monkeypatch.setattr(prep.shutil, "which", lambda name: "docker")  # docker "installed"
    options = prep.PrepareOptions(store=str(tmp_path / "s"), work_dir=tmp_path / "w")
    recipe = RECIPE
    if kind == "present":
        assert prep.choose_rows_builder(recipe, options) == "docker"
    elif kind in ABSENT:
        with pytest.raises(BadInput, match="not on this machine"):
            prep.choose_rows_builder(recipe, options)
    else:
        with pytest.raises(InfraError) as err:
            prep.choose_rows_builder(recipe, options)
        assert "not on this machine" not in str(err.value)  # never offered as a pull
    assert not [c for c in _calls(log) if c[:1] == ["pull"]]


@pytest.mark.parametrize("docker", KINDS, indirect=True)
def test_the_build_reading_the_recipe_images_layers(docker):
    kind, path, log = docker
    said: list[str] = []
    if kind == "present":
        assert img._base_layers(path, "r@d", said.append) == LAYERS
    elif kind in ABSENT:  # pulled, then it must be there: this stand-in still says no
        with pytest.raises(InfraError, match="not here"):
            img._base_layers(path, "r@d", said.append)
        assert ["pull", "r@d"] in _calls(log)
        return
    else:
        with pytest.raises(InfraError):
            img._base_layers(path, "r@d", said.append)
    assert not [c for c in _calls(log) if c[:1] == ["pull"]]
