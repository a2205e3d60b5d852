"""A recipe is named the way a user names it: its file, its name under recipes/ (what `history
--help` shows as its example) or its content slug, all meaning the same recipe."""

from __future__ import annotations

import re

from support.cli import REPO, SEED, reproduce_here

from launcher.inputs.recipe import load_recipe
from launcher.records.history_rows import slug_of


def test_a_recipe_file_its_name_and_its_slug_are_one_recipe(tmp_path, monkeypatch):
    slug = load_recipe(SEED).slug
    name = str(SEED.relative_to(REPO / "recipes")).removesuffix(".yaml")
    assert slug_of(str(SEED)) == slug_of(name) == slug_of(f"{name}.yaml") == slug_of(slug) == slug
    assert slug_of("some/other/thing") == "some/other/thing"  # not a recipe name: a slug
    # a name is looked up under recipes/ only, never climbing out of it: a recipe planted where
    # recipes/../../etc/passwd.yaml leads (and no file at ../../etc/passwd itself) is not found
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    (tmp_path / "a" / "etc").mkdir()
    (tmp_path / "a" / "etc" / "passwd.yaml").write_bytes(SEED.read_bytes())
    monkeypatch.chdir(here)
    assert slug_of("../../etc/passwd") == "../../etc/passwd"


def test_the_help_example_works(tmp_path):
    shown = reproduce_here("history", "--help", env={"COLUMNS": "300"}).out
    example = re.search(r"recipes/ \(([^)]+)\)", shown)
    assert example, shown
    for ref in (example.group(1), str(SEED)):
        res = reproduce_here("history", ref, "--history", tmp_path / "h.sqlite", cwd=tmp_path)
        assert res.code == 2 and load_recipe(SEED).slug in res.err  # found as the seed: no runs
        assert "Traceback" not in res.err
