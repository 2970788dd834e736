"""rlkit.utils.tokens.pad_token_id: the tokenizer's pad, else the fallbacks in order, else its (first) EOS."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlkit.errors import UserError
from rlkit.utils.tokens import pad_token_id


def test_pad_then_fallbacks_then_eos():
    assert pad_token_id(SimpleNamespace(pad_token_id=3, eos_token_id=7), 5) == 3
    assert pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=7), None, [5, 6]) == 5
    assert pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=[7, 8])) == 7
    assert pad_token_id(SimpleNamespace(eos_token_id=7)) == 7  # no pad attribute at all


def test_none_set_names_where():
    with pytest.raises(UserError, match="model/x: the tokenizer has neither a pad nor an eos token"):
        pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=[]), None, where="model/x: the tokenizer")
