"""Token strings to block input: a seeded embedding per token plus sinusoidal positions."""

import math

import torch

from blocktrace.sources.inputs import sinusoidal_positions, split_tokens, token_embedding, tokens_to_input


def test_same_token_same_vector_and_positions_tell_them_apart():
    x = tokens_to_input(["猫", "吃", "猫"], d_model=8, seed=0, batch=None)
    pe = sinusoidal_positions(3, 8)
    assert torch.allclose(x[0] - pe[0], x[2] - pe[2], atol=1e-6)  # the same embedding for 猫 at both places
    assert not torch.allclose(x[0], x[2])
    assert torch.equal(token_embedding("猫", 8, 0), token_embedding("猫", 8, 0))
    assert not torch.equal(token_embedding("猫", 8, 0), token_embedding("猫", 8, 1))


def test_sinusoidal_positions_follow_the_formula():
    pe = sinusoidal_positions(5, 6)
    for p in range(5):
        for i in range(3):
            angle = p / 10000 ** (2 * i / 6)
            assert math.isclose(pe[p, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(pe[p, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_token_words_split_on_whitespace():
    assert split_tokens(["猫 吃  鱼"]) == ["猫", "吃", "鱼"]
    assert split_tokens(["猫", "吃 鱼"]) == ["猫", "吃", "鱼"]


def test_token_ids_are_ascii_integers_only():
    """Issue 45.8: `+1` (and int()'s other spellings: 1_000, Arabic-Indic digits) were taken as token ids."""
    import pytest

    from blocktrace.errors import UsageError
    from blocktrace.sources.inputs import parse_token_ids

    assert parse_token_ids("1 2 / -3") == [[1, 2], [-3]]
    for text in ("+1 2", "1_000", "\u0661", "1.0"):
        with pytest.raises(UsageError, match="ASCII digits"):
            parse_token_ids(text)
