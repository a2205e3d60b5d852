"""No recipe field is silently ignored: the schema walked, every leaf in one table
(launcher/pages/recipe_fields.py), and each entry checked by behaviour, not by grep.

- the table covers exactly the schema's leaves (a new schema field without an entry fails here);
- READ: the field changed (the recipe otherwise valid) changes the plan (the dry run, node.sh
  included) or the verdict and figures of one fixed log;
- CHECKED: the field contradicting what it states elsewhere is refused by `validate`, naming it;
- SHOWN: the field's value appears on the run's report page (report.html's recipe card).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.measure import SEED, run_standin, step_times_for_tps
from support.paths import REPO

from launcher.inputs.recipe import recipe_schema, validate_raw
from launcher.inputs.recipe_fields import CHECKED, FIELDS, READ, SHOWN
from launcher.inputs.yamlschema import read_yaml_mapping

Raw = dict[str, Any]
DIFF = "--- a/train.py\n+++ b/train.py\n@@ -1 +1,2 @@\n import os\n+import sys\n"
DIFF2 = DIFF.replace("import sys", "import json")
sha = lambda text: hashlib.sha256(text.encode()).hexdigest()  # noqa: E731


def schema_leaves(schema: dict, path: str = "") -> list[str]:
    """Every field path the schema defines (`[]` list items, `*` further keys)."""
    if schema.get("type") == "array" and (schema.get("items") or {}).get("properties"):
        return schema_leaves(schema["items"], path + "[]")
    props = schema.get("properties")
    for alt in schema.get("oneOf") or []:
        props = props or alt.get("properties")
    if not props:
        return [f"{path}.*"] if isinstance(schema.get("additionalProperties"), dict) else [path]
    out = [
        leaf
        for k, sub in props.items()
        for leaf in schema_leaves(sub, f"{path}.{k}" if path else k)
    ]
    if isinstance(schema.get("additionalProperties"), dict):
        out.append(f"{path}.*")
    return out


def test_the_table_covers_exactly_the_schemas_leaves():
    leaves = schema_leaves(recipe_schema())
    assert len(leaves) == len(set(leaves)) > 100
    assert sorted(FIELDS) == sorted(leaves), {
        "not in the table": sorted(set(leaves) - set(FIELDS)),
        "not in the schema": sorted(set(FIELDS) - set(leaves)),
    }
    assert {h.how for h in FIELDS.values()} == {READ, CHECKED, SHOWN}
    assert all(h.by for h in FIELDS.values())


def seed() -> Raw:
    return read_yaml_mapping(SEED, "recipe")[0]


def setp(raw: Raw, path: str, value: Any) -> None:
    node = raw
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value


def run_sub(old: str, new: str) -> Callable[[Raw], None]:
    def edit(raw: Raw) -> None:
        assert old in raw["run"], old
        raw["run"] = raw["run"].replace(old, new)

    return edit


def both(*edits: Callable[[Raw], None]) -> Callable[[Raw], None]:
    def edit(raw: Raw) -> None:
        for e in edits:
            e(raw)

    return edit


def to(path: str, value: Any) -> Callable[[Raw], None]:
    return lambda raw: setp(raw, path, value)


def text_sub(path: str, old: str, new: str) -> Callable[[Raw], None]:
    def edit(raw: Raw) -> None:
        node = raw
        for key in path.split(".")[:-1]:
            node = node[key]
        last = path.split(".")[-1]
        assert old in str(node[last]), (path, old)
        node[last] = str(node[last]).replace(old, new)

    return edit


DIGEST = "sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca"
OTHER = "sha256:" + "5" * 64
PATCH = {"name": "a", "checkout": "/root/miles", "diff": DIFF, "sha256": sha(DIFF)}
with_patch = to("patches", [dict(PATCH)])

# READ: (base edit or None, the change, "plan" or "verdict")
READS: dict[str, tuple[Callable[[Raw], None] | None, Callable[[Raw], None], str]] = {
    "model": (None, to("model", "Qwen3-30B-A3B-X"), "plan"),
    "gpu.type": (None, to("gpu.type", "NVIDIA H200"), "plan"),
    "gpu.memory_gb": (None, to("gpu.memory_gb", 140), "plan"),
    "gpu.count": (None, both(to("gpu.count", 16), to("layout.dp", 16),
                             run_sub("--actor-num-nodes 1", "--actor-num-nodes 2")), "verdict"),
    "gpu.instance": (None, to("gpu.instance", "AWS p5e.48xlarge"), "plan"),
    "stack.framework": (None, text_sub("stack.framework", "78527b91", "78527b92"), "plan"),
    "stack.megatron_lm": (None, text_sub("stack.megatron_lm", "37f91617", "37f91618"), "plan"),
    "stack.transformer_engine": (None, to("stack.transformer_engine", "2.17.1"), "plan"),
    "stack.pytorch": (None, to("stack.pytorch", "2.11.1"), "plan"),
    "stack.cuda": (None, to("stack.cuda", "13.1"), "plan"),
    "stack.nccl": (None, to("stack.nccl", "2.28.8"), "plan"),
    "stack.deepep": (None, to("stack.deepep", "1.2.2"), "plan"),
    "stack.python": (None, to("stack.python", "3.12.4"), "plan"),
    "stack.source": (None, text_sub("stack.source", DIGEST, OTHER), "plan"),
    "stack.image.repository": (to("stack.image", {"repository": "radixark/miles", "digest": DIGEST}),
                               to("stack.image.repository", "radixark/miles2"), "plan"),
    "stack.image.digest": (to("stack.image", {"repository": "radixark/miles", "digest": DIGEST}),
                           to("stack.image.digest", OTHER), "plan"),
    "workload.row_tokens": (None, both(to("workload.row_tokens", 4096),
                                       to("workload.dataset.build.row_tokens", 4096),
                                       to("result.window_tokens", 15 * 128 * 4096)), "plan"),
    "workload.dataset.name": (lambda r: r["workload"]["dataset"]["build"].pop("name"),
                              to("workload.dataset.name", "Tulu 4"), "plan"),
    "workload.dataset.source": (None, to("workload.dataset.source", "allenai/tulu-4"), "plan"),
    "workload.dataset.revision": (None, to("workload.dataset.revision", "c" * 40), "plan"),
    "workload.dataset.build.name": (None, to("workload.dataset.build.name", "rows-v2"), "plan"),
    "workload.dataset.build.tokenizer": (None, text_sub("workload.dataset.build.tokenizer",
                                                        "9216db57", "9216db58"), "plan"),
    "workload.dataset.build.loss_mask": (None, to("workload.dataset.build.loss_mask", "llama3"),
                                         "plan"),
    "workload.dataset.build.rows": (None, to("workload.dataset.build.rows", 6401), "plan"),
    "workload.dataset.build.seed": (None, to("workload.dataset.build.seed", 43), "plan"),
    "workload.dataset.build.parquet_sha256": (None, to("workload.dataset.build.parquet_sha256",
                                                       "d" * 64), "plan"),
    "workload.dataset.build.parquet_bytes": (None, to("workload.dataset.build.parquet_bytes",
                                                      999_999_999), "plan"),
    "layout.label": (None, to("layout.label", "TP1 PP1 EP8 DP8 v2"), "plan"),
    "result.tokens_per_s_per_gpu": (None, both(to("result.tokens_per_s_per_gpu", 7500.0),
                                               to("result.mfu", 0.1384)), "verdict"),
    "result.usd_per_million_tokens": (None, to("result.usd_per_million_tokens", 0.36), "verdict"),
    "result.step_time_cv_percent": (None, to("result.step_time_cv_percent", 0.1), "verdict"),
    "result.mfu": (None, both(to("result.mfu", 0.2), to("result.mfu_note", "another count")),
                   "verdict"),
    "result.active_params.count": (None, both(to("result.active_params.count", 3_300_000_000),
                                              to("result.mfu", 0.1384)), "verdict"),
    "result.active_params.source": (None, to("result.active_params.source",
                                             "https://huggingface.co/Qwen/Qwen3-30B-A3B-Base"),
                                    "plan"),
    "result.active_params.revision": (None, to("result.active_params.revision", "main"), "plan"),
    "result.window": (None, both(to("result.window", [6, 19]),
                                 to("result.window_tokens", 14 * 128 * 8192)), "verdict"),
    "result.runs": (None, to("result.runs", 3), "plan"),
    "result.gpu_hours": (None, to("result.gpu_hours", 2.5), "plan"),
    "env.*": (None, to("env.FIELD_TEST_VAR", "1"), "plan"),
    "patches[].name": (with_patch, lambda r: r["patches"][0].update(name="b"), "plan"),
    "patches[].checkout": (with_patch, lambda r: r["patches"][0].update(checkout="/root/Megatron-LM"),
                           "plan"),
    "patches[].diff": (with_patch, lambda r: r["patches"][0].update(diff=DIFF2, sha256=sha(DIFF2)),
                       "plan"),
    "patches[].file": (lambda r: r.update(patches=[{"checkout": "/root/miles", "file": "a.diff",
                                                    "sha256": sha(DIFF)}]),
                       lambda r: r["patches"][0].update(file="b.diff", sha256=sha(DIFF2)), "plan"),
    "run": (None, lambda r: r.update(run=r["run"] + "echo done\n"), "plan"),
}  # fmt: skip

# CHECKED: (base edit or None, the contradiction, the field validate names)
CHECKS: dict[str, tuple[Callable[[Raw], None] | None, Callable[[Raw], None], str]] = {
    "schema_version": (None, to("schema_version", 2), "schema_version"),
    "gpu.per_node": (None, to("gpu.per_node", 4), "gpu.per_node"),
    "workload.global_batch": (None, to("workload.global_batch", 64), "workload.global_batch"),
    "workload.dataset.build.row_tokens": (None, to("workload.dataset.build.row_tokens", 4096),
                                          "workload.dataset.build.row_tokens"),
    "layout.tp": (None, both(to("layout.tp", 2), to("layout.dp", 4)), "layout.tp"),
    "layout.pp": (None, both(to("layout.pp", 2), to("layout.dp", 4)), "layout.pp"),
    "layout.vpp": (None, to("layout.vpp", 2), "layout.vpp"),
    "layout.cp": (None, both(to("layout.cp", 2), to("layout.dp", 4)), "layout.cp"),
    "layout.ep": (None, to("layout.ep", 4), "layout.ep"),
    "layout.etp": (None, to("layout.etp", 2), "layout.etp"),
    "layout.dp": (None, to("layout.dp", 4), "layout"),
    "layout.sequence_parallel": (None, to("layout.sequence_parallel", True),
                                 "layout.sequence_parallel"),
    "layout.max_tokens_per_gpu": (None, to("layout.max_tokens_per_gpu", 8192),
                                  "layout.max_tokens_per_gpu"),
    "layout.recompute.granularity": (None, to("layout.recompute.granularity", "selective"),
                                     "layout.recompute.granularity"),
    "layout.recompute.method": (None, to("layout.recompute.method", "block"),
                                "layout.recompute.method"),
    "layout.recompute.num_layers": (None, to("layout.recompute.num_layers", 2),
                                    "layout.recompute.num_layers"),
    "result.steps_per_run": (None, to("result.steps_per_run", 30), "result.steps_per_run"),
    "result.window_tokens": (None, to("result.window_tokens", 1), "result.window_tokens"),
    "patches[].sha256": (with_patch, lambda r: r["patches"][0].update(sha256="0" * 64),
                         "patches[0].sha256"),
}  # fmt: skip


def test_every_entry_has_its_behaviour_check():
    assert sorted(READS) == sorted(p for p, h in FIELDS.items() if h.how == READ)
    assert sorted(CHECKS) == sorted(p for p, h in FIELDS.items() if h.how == CHECKED)


def write(tmp_path: Path, name: str, raw: Raw) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "a.diff").write_text(DIFF)
    (d / "b.diff").write_text(DIFF2)
    path = d / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def plan_text(path: Path) -> str:
    from launcher.runner.prelaunch import RunOptions, dry_run_text, prepare

    text = dry_run_text(prepare(path, RunOptions(cluster="local", run_id="fields")))
    text = text.replace(str(path), "RECIPE")
    text = re.sub(r"-[0-9a-f]{10}\b", "-SLUGHASH", text)
    return re.sub(r"recipe file sha256 [0-9a-f]{64}", "recipe file sha256 X", text)


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fields") / "train.log"
    run_standin(path, steps=20, step_time_s=step_times_for_tps(6913.23))
    return path


def judged(path: Path, log: Path) -> str:
    from launcher.inputs.recipe import load_recipe
    from launcher.results.evaluate import measure_path

    result, verdict = measure_path(log, load_recipe(path))
    return json.dumps([result.to_dict(), verdict.to_dict()], sort_keys=True, default=str)


@pytest.mark.parametrize("path", sorted(READS))
def test_a_read_field_changed_changes_the_plan_or_the_verdict(path, tmp_path, log):
    base_edit, change, effect = READS[path]
    base = seed()
    if base_edit:
        base_edit(base)
    changed = json.loads(json.dumps(base))
    change(changed)
    assert validate_raw(changed) == [], validate_raw(changed)  # a valid recipe, not a refusal
    a, b = write(tmp_path, "a", base), write(tmp_path, "b", changed)
    if effect == "plan":
        assert plan_text(a) != plan_text(b), path
    else:
        assert judged(a, log) != judged(b, log), path


@pytest.mark.parametrize("path", sorted(CHECKS))
def test_a_checked_field_contradicted_is_refused(path):
    base_edit, change, field = CHECKS[path]
    raw = seed()
    if base_edit:
        base_edit(raw)
    assert not [f for f, _ in validate_raw(raw) if f == field]
    change(raw)
    assert [f for f, _ in validate_raw(raw) if f == field], (path, validate_raw(raw))


def test_every_shown_field_appears_on_the_report_page(tmp_path):
    from support.pages import make_run

    from launcher.pages import write_run_page

    rd = make_run(tmp_path)
    raw = seed()
    raw["stack"]["image"] = {"repository": "radixark/miles", "digest": DIGEST, "tag": "v0"}
    raw["patches"] = [dict(PATCH)]
    marks: dict[str, str] = {}
    for path, honoured in FIELDS.items():
        if honoured.how != SHOWN:
            continue
        mark = f"ZZ{len(marks):03d}ZZ"
        marks[path] = mark
        if path == "stack.*":
            raw["stack"]["sglang"] = mark
        elif path.startswith("correctness.component_tests[]."):
            raw["correctness"]["component_tests"][0][path.rsplit(".", 1)[1]] = mark
        elif path == "patches[].source":
            raw["patches"][0]["source"] = mark
        else:
            setp(raw, path, mark)
    (rd / "recipe.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    write_run_page(rd)
    page = (rd / "report.html").read_text()
    missing = [p for p, m in marks.items() if m not in page]
    assert not missing, missing


def test_the_probes_see_no_change_where_there_is_none(tmp_path, log):
    """The control: the same recipe in two places gives the same plan and the same verdict, so
    a difference above is the field's doing."""
    a, b = write(tmp_path, "a", seed()), write(tmp_path, "b", seed())
    assert plan_text(a) == plan_text(b)
    assert judged(a, log) == judged(b, log)
    # and a field the table calls informational changes neither
    c = seed()
    c["notes"] = "another note"
    c["layout"]["summary"] = "another summary"
    assert plan_text(write(tmp_path, "c", c)) == plan_text(a)
    assert judged(write(tmp_path, "d", c), log) == judged(a, log)


def test_the_docs_list_the_table_as_it_is():
    doc = (REPO / "docs" / "recipe-fields.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| (\w+) \|", doc, re.M)
    assert rows == [(p, h.how) for p, h in FIELDS.items()]
