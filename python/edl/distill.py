"""edl.distill: a distillation student's reader of its teachers' predictions, over libedldistill
(edl/distill.h) and the service discovery (edl/discovery.h); docs/distill.md.

    import edl.distill
    reader = edl.distill.Reader("mlp", loader, cols=4, max_abs=1)   # the teachers of service mlp
    for (x, y), soft in reader:          # each batch once, with its teachers' predictions
        loss = kl(student(x), soft)

The reader sends the batches' inputs to the teachers that the service assigns this student
(found in the job's etcd from the agent's environment, followed as teachers come, go and die),
keeps up to ``in_flight`` batches at each teacher and ``window`` in all, sends a batch whose
teacher failed, timed out or answered badly to another, and yields every batch exactly once,
in the order of ``batches`` unless ``ordered=False``. A student that states what it takes
(``cols``: the columns of every reply; ``max_abs``: the largest magnitude) has replies of
another shape or with values past it (or not finite, always) counted as bad replies and sent
elsewhere, never yielded. A batch that no teacher answered well in ``max_tries`` tries raises
edl.Error (EDL_EPEER): a batch is never silently dropped.
"""
import os
import sys
import time

import numpy as np

from . import _edl, _link
from .ps import _is_tensor, _memory

__all__ = ["Reader"]


def _default_inputs(batch):
    """The array to send of a batch: the batch itself, or the first item of a tuple or list
    (an (x, y) pair)."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


class Reader:
    """``Reader(service, batches, *, teachers=None, inputs=None, cols=None, max_abs=None,
    ordered=True, model="default", format="binary", in_flight=4, window=64, timeout_ms=10000,
    max_tries=8, student=None, wait_s=None)``.

    - ``service``: the teachers' service (None: $EDL_SERVICE, which the agent sets for a job
      with teachers), or ``teachers=["http://host:port", ...]`` (or $EDL_TEACHERS) for a fixed
      set. The service is read from the etcd of the agent's environment (EDL_ETCD_*).
    - ``batches``: any iterable; ``inputs(batch)`` gives the float32 array or CPU tensor of
      shape (rows, features) to send (default: the batch, or its first item). Predictions come
      back as the same kind: a numpy array, or a tensor, of shape (rows, cols).
    - ``format``: "binary" (edl's tensor form) or "json" (TensorFlow Serving's REST form).
    - ``wait_s``: raise edl.Error (EDL_ETIMEDOUT) when no batch was answered for this long
      (None: wait for teachers as long as it takes, saying so every 5 s on stderr).
    Iterating again goes over ``batches`` again (an iterator is used up once).
    """

    def __init__(self, service=None, batches=None, *, teachers=None, inputs=None, cols=None,
                 max_abs=None, ordered=True, model="default", format="binary", in_flight=4,
                 window=64, timeout_ms=10000, max_tries=8, student=None, wait_s=None,
                 prefix=None):
        if batches is None:
            raise TypeError("edl.distill.Reader: give the batches to read (any iterable)")
        if format not in ("binary", "json"):
            raise ValueError(f"edl.distill.Reader: format {format!r}: binary or json")
        if window < 1:
            raise ValueError(f"edl.distill.Reader: window {window}: at least 1")
        if teachers is None and service is None:
            service = os.environ.get("EDL_SERVICE") or None
            teachers = os.environ.get("EDL_TEACHERS") if service is None else None
        if isinstance(teachers, str):
            teachers = [t for t in teachers.split(",") if t]
        if not service and not teachers:
            raise ValueError("edl.distill.Reader: no teachers: give a service (or set "
                             "EDL_SERVICE) or teachers=[\"http://host:port\", ...]")
        self.service, self.teachers = service, list(teachers or [])
        self.batches, self.inputs = batches, inputs or _default_inputs
        self.window, self.wait_s, self.prefix = window, wait_s, prefix
        self.student = student or self._student_name()
        self._opts = dict(model=model, binary=format == "binary", in_flight=in_flight,
                          timeout_ms=timeout_ms, ordered=ordered, max_tries=max_tries,
                          cols=cols or 0, max_abs=max_abs or 0.0)
        self._d = None

    @staticmethod
    def _student_name():
        pod = os.environ.get("EDL_POD_ID", "")
        ok = 0 < len(pod) <= 63 and all(c.isdigit() or "a" <= c <= "z" or c == "-" for c in pod)
        return pod if ok else f"student-{os.getpid()}"

    def _open(self):
        if self._d is not None:
            return self._d
        d = _edl.Distill(**self._opts)
        try:
            if self.service:
                d.follow(self.service, self.student, self.prefix)
                self._apply(d.poll(0, True))
            else:
                d.set_teachers(self.teachers)
        except BaseException:
            d.close()
            raise
        self._d = d
        return d

    def _apply(self, changed):
        if changed is not None:
            self.teachers = [ep for _, ep in changed]

    @property
    def stats(self):
        """The client's counters: submitted, delivered, retried, timeouts, conn_errors,
        http_errors, bad_replies, failed."""
        return self._open().stats()

    def close(self):
        """Close the client (and give the student's place in the service up)."""
        if self._d is not None:
            d, self._d = self._d, None
            d.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _submit(self, d, batch):
        x = self.inputs(batch)
        if getattr(x, "ndim", None) != 2:
            raise ValueError(f"edl.distill.Reader: a batch's inputs have shape "
                             f"{tuple(getattr(x, 'shape', ()))}; want (rows, features)")
        addr, nbytes, _ = _memory(x, "inputs", ("float32",))
        return d.submit(addr, nbytes, x.shape[0], x.shape[1]), _is_tensor(x)

    @staticmethod
    def _predictions(out, rows, cols, tensor):
        if tensor:
            import torch
            return torch.frombuffer(out, dtype=torch.float32).view(rows, cols)
        return np.frombuffer(out, dtype=np.float32).reshape(rows, cols)

    def __iter__(self):
        d = self._open()
        held, source, exhausted = {}, iter(self.batches), False
        last = time.monotonic()
        try:
            while True:
                while not exhausted and len(held) < self.window:
                    try:
                        batch = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    bid, tensor = self._submit(d, batch)
                    held[bid] = (batch, tensor)
                if not held:
                    self._report(d, True)
                    return
                got = d.next(100)
                self._report(d)
                if self.service:
                    self._apply(d.poll(0))
                if got is None:
                    last = self._waiting(last, len(held))
                    continue
                last = time.monotonic()
                bid, status, rows, cols, tries, teacher, out, why = got
                batch, tensor = held.pop(bid)
                if status:  # why names each teacher that failed it and how
                    name, _ = _edl.strerror(status)
                    raise _edl.error(status, f"edl.distill: batch {bid}: {why} ({name}; "
                                     f"stats {d.stats()})")
                yield batch, self._predictions(out, rows, cols, tensor)
        finally:
            if held:  # left before the end: the client's batches in flight are not ours now
                self.close()

    def _report(self, d, now=False):
        """Tell the agent the batches in flight and the retries so far (its /metrics), at most
        once a second (now: at once); nothing outside edl."""
        if now or time.monotonic() - getattr(self, "_reported", 0) >= 1:
            self._reported = time.monotonic()
            _link().report_distill(d.pending(), d.stats()["retried"])

    def _waiting(self, last, outstanding):
        waited = time.monotonic() - last
        if self.wait_s is not None and waited > self.wait_s:
            raise _edl.error(_edl.EDL_ETIMEDOUT, f"edl.distill: no batch answered for "
                             f"{waited:.0f} s ({outstanding} outstanding; teachers "
                             f"{self.teachers or 'none'}; stats {self._d.stats()})")
        if time.monotonic() - getattr(self, "_said", 0) >= 5 and waited >= 5:
            self._said = time.monotonic()
            print(f"edl.distill: waiting for teachers ({outstanding} batches outstanding; "
                  f"teachers: {self.teachers or 'none'})", file=sys.stderr, flush=True)
        return last
