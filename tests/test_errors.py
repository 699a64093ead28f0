"""Optional dependencies: a missing extra is a `MissingExtraError` naming the install."""

import sys

import pytest

from vidax.errors import USER_ERRORS, MissingExtraError, require_extra
from vidax.models.umt5.tokenizer import Tokenizer


def test_a_missing_module_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` now fails
    with pytest.raises(
        MissingExtraError,
        match=r"reading x needs the `tokenizers` package: "
        r"pip install 'vidax\[text\]'",
    ):
        require_extra("tokenizers", extra="text", purpose="reading x")
    assert issubclass(MissingExtraError, USER_ERRORS)


def test_a_present_module_is_returned():
    assert require_extra("json", extra="none", purpose="p") is sys.modules["json"]


def test_the_tokenizer_reports_a_missing_extra(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(MissingExtraError, match="needs the `tokenizers` package"):
        Tokenizer(tmp_path)


def test_an_import_bug_is_not_reported_as_a_missing_extra(tmp_path, monkeypatch):
    (tmp_path / "vidax_broken_extra.py").write_text(
        "raise ImportError('a bug, not a missing package')"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="a bug") as info:
        require_extra("vidax_broken_extra", extra="x", purpose="p")
    assert not isinstance(info.value, MissingExtraError)
