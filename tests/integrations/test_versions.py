"""attnkit.integrations.versions: the tested transformers range, kept in one place.

The range agrees with pyproject.toml's lower bound and with the transformers guide; the check
refuses a transformers that lacks a needed feature (naming the installed version and the range)
and warns once above the range. Fake transformers packages stand in for other releases (nothing
installed).
"""

from __future__ import annotations

import re
import sys
import types
import warnings
from pathlib import Path

import pytest
from packaging.version import Version

from attnkit.integrations import versions as V

ROOT = Path(__file__).resolve().parents[2]


def test_range_agrees_with_pyproject_and_the_guide():
    text = (ROOT / "pyproject.toml").read_text()
    bounds = set(re.findall(r'"transformers>=([0-9.]+)"', text))
    assert bounds, "pyproject.toml: no transformers>= bound"
    assert {Version(b) for b in bounds} == {Version(V.TRANSFORMERS_OLDEST)}
    assert "transformers<" not in text  # no upper bound: users upgrade on their own schedule
    assert Version(V.TRANSFORMERS_OLDEST) <= Version(V.TRANSFORMERS_TESTED)
    guide = (ROOT / "docs" / "guides" / "transformers.md").read_text()
    assert f"tested with transformers {V.tested_range()}" in " ".join(guide.split())


def fake_transformers(monkeypatch, name: str, version: str, drop: str | None = None):
    """A package ``name`` with ``name.masking_utils``, holding every needed name but ``drop``."""
    top = types.ModuleType(name)
    top.__version__ = version
    sub = types.ModuleType(f"{name}.masking_utils")
    for mod, names in ((top, V.NEEDED[""]), (sub, V.NEEDED["masking_utils"])):
        for n in names:
            if n != drop:
                setattr(mod, n, object())
    monkeypatch.setitem(sys.modules, name, top)
    monkeypatch.setitem(sys.modules, f"{name}.masking_utils", sub)
    return top


def test_installed_transformers_passes():
    tf = pytest.importorskip("transformers", reason="transformers not installed")
    with warnings.catch_warnings():
        if Version(tf.__version__) <= Version(V.TRANSFORMERS_TESTED):
            warnings.simplefilter("error", V.UntestedTransformersWarning)
        V.check_transformers(tf)


def test_missing_feature_is_one_clear_error(monkeypatch):
    tf = fake_transformers(monkeypatch, "fake_tf_missing", "5.24.0", drop="and_masks")
    with pytest.raises(V.UnsupportedTransformersError) as e:
        V.check_transformers(tf)
    msg = str(e.value)
    assert "fake_tf_missing.masking_utils.and_masks" in msg
    assert "5.24.0" in msg and str(V.tested_range()) in msg


def test_missing_submodule_is_one_clear_error(monkeypatch):
    tf = fake_transformers(monkeypatch, "fake_tf_nosub", "5.24.0")
    monkeypatch.setitem(sys.modules, "fake_tf_nosub.masking_utils", None)  # import fails
    with pytest.raises(V.UnsupportedTransformersError, match="fake_tf_nosub.masking_utils"):
        V.check_transformers(tf)


def test_below_the_range_is_refused(monkeypatch):
    tf = fake_transformers(monkeypatch, "fake_tf_old", "5.1.0")
    with pytest.raises(V.UnsupportedTransformersError, match=r"5\.1\.0 is older"):
        V.check_transformers(tf)


def test_above_the_range_warns_once_and_goes_on(monkeypatch):
    newer = str(Version(V.TRANSFORMERS_TESTED).major + 1) + ".0.0"
    tf = fake_transformers(monkeypatch, "fake_tf_new", newer)
    monkeypatch.setattr(V, "_CHECKED", set())
    with pytest.warns(V.UntestedTransformersWarning, match=str(V.tested_range())):
        V.check_transformers(tf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        V.check_transformers(tf)  # once per process


def test_the_integration_checks_on_first_use(monkeypatch):
    pytest.importorskip("transformers", reason="transformers not installed")
    from attnkit.integrations import transformers as ak_hf

    seen = []
    monkeypatch.setattr(V, "check_transformers", lambda tf: seen.append(tf.__name__))
    ak_hf.is_registered()
    assert seen == ["transformers"]
