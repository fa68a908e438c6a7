"""TensorBoard event files written whole through epath, so they survive object stores.

Object stores cannot append. tensorboardX answers that with its own google-cloud-storage writer,
which re-uploads the whole, ever-growing events file at every flush (quadratic in the run's
length) and reaches no other store. Here the records of one events file stay in memory and the
file is rewritten through epath at each flush (one object write on gs://, a renamed temporary
file locally), and a file rolls over after `max_bytes`, so no step rewrites more than that.
"""

from __future__ import annotations

import struct
import time

from etils import epath
from tensorboardX.crc32c import crc32c
from tensorboardX.proto import event_pb2, summary_pb2


def masked_crc(data: bytes) -> int:
  """The TFRecord checksum: crc32c rotated right by 15 bits plus a constant."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
  """One TFRecord: length, its checksum, the payload, its checksum."""
  header = struct.pack("<Q", len(data))
  return (header + struct.pack("<I", masked_crc(header)) + data
          + struct.pack("<I", masked_crc(data)))


def scalar_event(step: int, scalars: dict[str, float], wall_time: float) -> event_pb2.Event:
  values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
  return event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values))


def write_whole(path: epath.Path, data: bytes) -> None:
  """Replaces the file at once: one object write on gs://, rename of a temp file locally."""
  if "://" in str(path):
    path.write_bytes(data)
    return
  tmp = path.parent / f".{path.name}.tmp"
  tmp.write_bytes(data)
  tmp.replace(path)


class EventsWriter:
  """Scalars of a run as TensorBoard events under `logdir`, one new file per writer.

  `purge_step` (on resume) writes the SessionLog.START event TensorBoard uses to hide the
  earlier files' events at and after that step, so each step is seen once.
  """

  def __init__(self, logdir, *, purge_step: int | None = None, max_bytes: int = 4 << 20):
    self.logdir = epath.Path(logdir)
    self.logdir.mkdir(parents=True, exist_ok=True)
    self.max_bytes = max_bytes
    self._stamp, self._part = time.time_ns(), 0
    self._records: list[bytes] = []
    self._size = 0
    self._header(purge_step)

  @property
  def path(self) -> epath.Path:
    return self.logdir / f"events.out.tfevents.{self._stamp}.scope_jax.{self._part:05d}"

  def _header(self, purge_step: int | None) -> None:
    now = time.time()
    self._add(event_pb2.Event(wall_time=now, file_version="brain.Event:2"))
    if purge_step is not None:
      self._add(event_pb2.Event(wall_time=now, step=purge_step, session_log=event_pb2.SessionLog(
          status=event_pb2.SessionLog.START)))

  def _add(self, event: event_pb2.Event) -> None:
    record = frame(event.SerializeToString())
    self._records.append(record)
    self._size += len(record)

  def scalars(self, step: int, values: dict[str, float]) -> None:
    if self._size > self.max_bytes:  # this file is final; the next one starts fresh
      self.flush()
      self._part, self._records, self._size = self._part + 1, [], 0
      self._header(None)
    self._add(scalar_event(step, values, time.time()))

  def flush(self) -> None:
    write_whole(self.path, b"".join(self._records))

  def close(self) -> None:
    self.flush()
