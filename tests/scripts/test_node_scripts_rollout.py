"""scripts/pretokenized_sft_rollout.py with stand-in Samples and a stand-in data source.

The stand-ins carry exactly the attributes miles' Sample and data source give the rollout
function (docs/miles-log.md, "The pre-tokenized rollout function").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from support.node_scripts import load_script

ro = load_script("pretokenized_sft_rollout")


@dataclass
class Sample:
    prompt: Any
    metadata: Any
    index: int | None = None
    tokens: list[int] = field(default_factory=list)
    response_length: int = 0
    loss_mask: list[int] | None = None
    reward: Any = None


class DataSource:
    def __init__(self, rows: list[tuple[Any, Any]]):
        self.rows = rows
        self.asked: list[int] = []
        self.pos = 0

    def get_samples(self, n: int) -> list[list[Sample]]:
        self.asked.append(n)
        out = [
            [Sample(p, m, index=self.pos + i)]
            for i, (p, m) in enumerate(self.rows[self.pos : self.pos + n])
        ]
        self.pos += n
        return out


class Args:
    rollout_batch_size = 2


def row(tokens: list[int], mask: list[int], **extra) -> tuple[list[int], dict]:
    return tokens, {"loss_mask": mask, "supervised_tokens": sum(mask), **extra}


@pytest.fixture(autouse=True)
def no_row_env(monkeypatch):
    monkeypatch.delenv(ro.ROW_TOKENS_ENV, raising=False)


def test_rows_become_trainable_samples_from_the_first_supervised_token():
    src = DataSource(
        [
            row([10, 11, 12, 13, 14, 15], [0, 0, 1, 0, 1, 1]),
            row([20, 21, 22, 23, 24, 25], [1, 1, 1, 1, 1, 1]),
            row([30, 31, 32, 33, 34, 35], [0, 0, 0, 0, 0, 1]),
        ]
    )
    groups = ro.generate_rollout(Args(), 0, src)
    assert src.asked == [2] and len(groups) == 2 and all(len(g) == 1 for g in groups)
    a, b = groups[0][0], groups[1][0]
    assert a.tokens == [10, 11, 12, 13, 14, 15]
    assert a.response_length == 4 and a.loss_mask == [1, 0, 1, 1] and a.reward == 0
    assert b.response_length == 6 and b.loss_mask == [1] * 6
    assert len(a.loss_mask) == a.response_length
    # the next rollout continues where the data source left off
    ((c,),) = ro.generate_rollout(type("A", (), {"rollout_batch_size": 1}), 1, src)
    assert c.response_length == 1 and c.loss_mask == [1] and c.tokens[-1] == 35


def test_array_like_columns_are_accepted_as_lists():
    class Arr(list):
        def tolist(self):
            return list(self)

    import array

    src = DataSource(
        [
            (array.array("q", [1, 2, 3]), {"loss_mask": Arr([0, 1, 1])}),
            ([4.0, 5.0], {"loss_mask": [1, 1]}),
        ]
    )
    a, b = (g[0] for g in ro.generate_rollout(Args(), 0, src))
    assert a.tokens == [1, 2, 3] and a.loss_mask == [1, 1]
    assert b.tokens == [4, 5] and type(b.tokens[0]) is int


def test_row_length_is_checked_against_the_recipe_row_tokens(monkeypatch):
    monkeypatch.setenv(ro.ROW_TOKENS_ENV, "4")
    src = DataSource([row([1, 2, 3, 4], [0, 1, 1, 1]), row([1, 2, 3], [0, 1, 1])])
    with pytest.raises(
        ValueError,
        match=r"rollout 7 sample 1 \(dataset index 1\): the row has 3 tokens, expected 4",
    ):
        ro.generate_rollout(Args(), 7, src)


@pytest.mark.parametrize(
    "prompt, metadata, message",
    [
        ([1, 2, 3], {"loss_mask": [0, 1]}, "has 2 entries for a row of 3 tokens"),
        ([1, 2, 3], {"loss_mask": [0, 0, 0]}, "no supervised token"),
        ([1, 2, 3], {"loss_mask": [0, 2, 1]}, r"holds \[2\], expected only 0 and 1"),
        (
            [1, 2, 3],
            {"loss_mask": [0, 1, 1], "supervised_tokens": 3},
            "supervised_tokens is 3 but the mask supervises 2",
        ),
        ([1, 2, 3], {"first_supervised": 1}, "has no 'loss_mask'"),
        ([1, 2, 3], '{"loss_mask": [0, 1, 1]}', "sample.metadata is str, expected a dict"),
        (
            [{"role": "user", "content": "hi"}],
            {"loss_mask": [1]},
            "is a message dict, not a token id",
        ),
        ("raw text", {"loss_mask": [1]}, "must be a list of token ids, got str"),
        (
            [1, "x", 3],
            {"loss_mask": [1, 1, 1]},
            r"sample.prompt \(the `messages` column\)\[1\] is 'x'",
        ),
        ([], {"loss_mask": []}, "the row is empty"),
    ],
)
def test_bad_rows_raise_a_clear_error_naming_the_sample(prompt, metadata, message):
    src = DataSource([row([5, 6], [0, 1]), (prompt, metadata)])
    with pytest.raises(ValueError, match=message) as err:
        ro.generate_rollout(Args(), 3, src)
    assert "rollout 3 sample 1 (dataset index 1)" in str(err.value)


def test_groups_of_several_samples_are_all_prepared_and_named():
    class Two(DataSource):
        def get_samples(self, n):
            return [[Sample(*self.rows[0]), Sample(*self.rows[1])]]

    good = Two([row([1, 2], [0, 1]), row([3, 4], [1, 1])])
    (g,) = ro.generate_rollout(Args(), 0, good)
    assert [s.response_length for s in g] == [1, 2]
    bad = Two([row([1, 2], [0, 1]), ([3, 4], {"loss_mask": [0, 0]})])
    with pytest.raises(ValueError, match=r"sample 0\.1: the row has no supervised"):
        ro.generate_rollout(Args(), 0, bad)


def test_evaluation_rollouts_are_refused_clearly():
    src = DataSource([row([1], [1])])
    with pytest.raises(ValueError, match="no evaluation rollouts"):
        ro.generate_rollout(Args(), 0, src, evaluation=True)
    assert src.asked == []


@pytest.mark.parametrize("value", ["abc", "0", "-5"])
def test_a_bad_row_tokens_environment_value_is_reported(monkeypatch, value):
    monkeypatch.setenv(ro.ROW_TOKENS_ENV, value)
    with pytest.raises(ValueError, match=ro.ROW_TOKENS_ENV):
        ro.generate_rollout(Args(), 0, DataSource([row([1], [1])]))


def test_summary_counts_supervised_tokens():
    groups = ro.generate_rollout(
        Args(), 0, DataSource([row([1, 2, 3, 4], [0, 1, 0, 1]), row([5, 6], [1, 1])])
    )
    assert ro.summarize(groups) == {
        "samples": 2,
        "tokens": 6,
        "supervised": 4,
        "supervised_ratio": 4 / 6,
    }
