"""A TensorBoard run continued across resumes: the events logged before the checkpoint carried into the log folder
the resumed run writes to, as ``metrics.csv``'s rows are across a multirun rerun (:mod:`grpolab.app.sweep_resume`).

A resumed run logs again from the checkpoint's step ``S``, so the carried events are those of the steps before
``S`` and the validation at ``S`` (the checkpoint was saved after it; it is not redone): the steps logged after a
periodic checkpoint and before a kill are dropped, and no step or wall time goes back. The previous run's
hyperparameters are dropped too (the resumed run logs its own config). They go, with their own wall times, into
one file named after the first event's time, so it sorts (and TensorBoard reads it) before the resumed run's file.
In the same folder (a multirun rerun, a requeued SLURM job) that file replaces the old ones.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("grpolab")

HPARAMS_PREFIX = "_hparams_/"  # the tags of TensorBoard's hparams plugin
FILE_VERSION = "brain.Event:2"


def event_files(log_dir: Path) -> list[Path]:
    """The event files of a TensorBoard log folder, in the order TensorBoard reads them (by name)."""
    return sorted(p for p in Path(log_dir).glob("events.out.tfevents.*") if p.is_file())


def keeps(event: object, step: int) -> bool:
    """Whether a resume from step ``step`` carries ``event`` (an ``Event`` proto): a summary of a step before
    ``step`` or a validation (``val/*`` tags only) at ``step``; no file version or session marker (the carried file
    writes its own), no hyperparameters."""
    if not event.HasField("summary"):
        return event.HasField("graph_def") and event.step < step
    tags = [v.tag for v in event.summary.value]
    if any(t.startswith(HPARAMS_PREFIX) for t in tags):
        return False
    return event.step < step or (event.step == step and all(t.startswith("val/") for t in tags))


def carry_events(source: Path, dest: Path, step: int) -> Path | None:
    """Carry the events of ``source`` that a resume from ``step`` keeps (:func:`keeps`) into one file in ``dest``,
    replacing ``dest``'s other event files when ``dest`` is ``source``. An event logged twice (tag and step) is kept
    once, the later one. Returns the file written, or None when ``source`` has no event files.

    Args:
        source: the TensorBoard log folder of the run the checkpoint belongs to.
        dest: the log folder the resumed run writes to (``source`` itself, or the same place in a new run folder).
        step: the checkpoint's ``global_step``.
    """
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    files = event_files(source)
    if not files:
        return None
    carried: dict[tuple, bytes] = {}
    first_wall = None
    for path in files:
        for raw in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(raw)
            first_wall = event.wall_time if first_wall is None else first_wall
            if keeps(event, step):
                key = (event.step, tuple(v.tag for v in event.summary.value), event.HasField("graph_def"))
                carried.pop(key, None)  # a duplicate (a carry cut short before its old files went): the later wins
                carried[key] = raw
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"events.out.tfevents.{int(first_wall):010d}.carried"
    tmp = dest / "carrying.tmp"  # no "tfevents" in the name: a running TensorBoard does not read it half written
    with tmp.open("wb") as fh:
        writer = RecordWriter(fh)
        writer.write(Event(wall_time=first_wall, step=0, file_version=FILE_VERSION).SerializeToString())
        for raw in carried.values():
            writer.write(raw)
    tmp.replace(target)
    for path in files:
        if path.parent.resolve() == dest.resolve() and path.name != target.name:
            path.unlink()
    log.info("TensorBoard: %d events before step %d carried from %s", len(carried), step, source)
    return target
