"""Wait for rank 0 before reading back a file only rank 0 wrote.

Before::

    if sdp.rank() == 0:
        with open(args.save, "wb") as f:
            torch.save(model, f)
    ...
    with open(args.save, "rb") as f:
        model = torch.load(f)

After::

    if sdp.rank() == 0:
        with open(args.save, "wb") as f:
            torch.save(model, f)
    ...
    sdp.barrier()
    with open(args.save, "rb") as f:
        model = torch.load(f)

Why: once the write runs on rank 0 only (``guard_rank0_writes``, or the script's own
``if rank == 0:``), the other ranks reach the read without waiting for it: they load the previous
file, a half-written one, or none (``FileNotFoundError``). A barrier before the read makes every
rank wait until rank 0 is past the write. The same path means the same code (``args.save``,
``"best.pt"``, ``os.path.join(d, "w.h5")``); a ``CheckpointManager``'s ``save()`` is read by
``restore(manager.latest_checkpoint)``; a Keras ``ModelCheckpoint`` (or the project's subclass of
it) writes its ``filepath`` during the ``fit`` (or Keras 2 ``fit_generator``) it is given to, and
one made in a callbacks factory (``make_callbacks(weights_path)``) writes what the factory's
caller hands it (``config["train"]["weights"]``, read back after that caller's ``fit``). Reads:
``torch.load``, ``torch.jit.load``, ``open`` for reading, ``numpy.load``, ``pickle.load``, Keras
``load_model``/``load_weights``, ``tf.saved_model.load``, ``checkpoint.restore``. A read that
itself runs on rank 0 only needs no barrier; one already preceded by a barrier gets no second.
The read must come after the write in the same function (or both at module level); a read
elsewhere gets no barrier. A path spelled in other quotes is the same file (``'w.h5'`` and
``"w.h5"``).

Files rank 0 alone copies (``shutil.copyfile``/``copy``/``copy2``/``copytree``/``move``: a data
set's files copied into a folder, which a later ``image_dataset_from_directory(folder)`` lists on
every rank) are waited for after the module-level statement that copies them, or the calls of
the helper of this file that does (``make_subset("train", 0, 1000)``; one barrier after the last
of several in a row), unless a test that can differ between ranks decides whether it runs.
"""

from __future__ import annotations

import itertools

import libcst as cst

from ..analysis import FileInfo
from ..base import Transform
from ..program.ranks import divergent_condition, only_called_on_rank0, rank0_only
from ..program.readback import (
    COPIES,
    METHOD_READS,
    READS,
    checkpoint_fits,
    copies_waited_for,
    is_barrier,
    read_path,
    same_file,
    written_path,
)
from ..program.writes import (
    FRAMEWORK_METHOD_WRITES,
    FRAMEWORK_WRITES,
    METHOD_WRITES,
    OPENERS,
    WRITES,
    argument,
)

#: Keras's checkpoint callback, by qualified name.
CHECKPOINT_CALLBACKS = (
    "keras.callbacks.ModelCheckpoint",
    "tensorflow.keras.callbacks.ModelCheckpoint",
    "keras.src.callbacks.ModelCheckpoint",
)


class BarrierBeforeReads(Transform):
    DESCRIPTION = "Wait for rank 0 (barrier) before reading back a file only rank 0 wrote."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})

    @classmethod
    def applies_to(cls, info: FileInfo) -> bool:
        # Also Horovod / SMDDP / SMP scripts: their own ``if hvd.rank() == 0:`` saves read back.
        return info.framework in cls.FRAMEWORKS and (
            info.convertible or info.origin in ("horovod", "smddp", "smp")
        )

    def prepare(self, module: cst.Module) -> None:
        self._strip: dict[cst.CSTNode, int] = {}
        framework = self.state.info.framework or ""
        writes: dict[str, list[cst.Call]] = {}
        calls = self.calls_to(*WRITES, *FRAMEWORK_WRITES.get(framework, {}), *OPENERS)
        for method in (*FRAMEWORK_METHOD_WRITES.get(framework, ()), *METHOD_WRITES):
            calls += self.method_calls(method)
        for call in calls:
            path = written_path(self.fm, call, framework)
            if path is not None and self._on_rank0_only(call):
                writes.setdefault(same_file(path), []).append(call)
        # A Keras ModelCheckpoint writes during the fit it is given to, on rank 0 only (the
        # converted fit, or a migrated script's own guard): that fit is the write.
        # A project's subclass (``CustomModelCheckpoint(ModelCheckpoint)``, rank 0's too) takes
        # the path by keyword (its own parameters come first); one made in a callbacks factory
        # writes what the factory's caller hands it.
        project = self.fm.project
        custom = self.calls_to(*project.rank0_callbacks) if project else []
        for call in [*self.calls_to(*CHECKPOINT_CALLBACKS), *custom]:
            path_arg = argument(call, 0, "filepath") if call not in custom else next(
                (a for a in call.args if a.keyword and a.keyword.value == "filepath"), None)
            if path_arg is None:
                continue
            for fit, path in checkpoint_fits(self.fm, call, path_arg.value):
                writes.setdefault(same_file(path), []).append(fit)
        self._wait_for_copies()
        if not writes:
            return
        reads = self.calls_to(*READS, *OPENERS)
        for method in METHOD_READS.get(framework, ()):
            reads += self.method_calls(method)
        done: set[int] = set()
        for call in sorted(reads, key=self._order):
            path = read_path(self.fm, call, framework)
            if path is None or same_file(path) not in writes or self._on_rank0_only(call):
                continue
            function = self.enclosing_function(call)
            if not any(
                self._order(w) < self._order(call) and self.enclosing_function(w) is function
                for w in writes[same_file(path)]
            ):
                continue
            stmt = self.enclosing_statement(call)
            if stmt is None or id(stmt) in done or is_barrier(self.fm, self._previous(stmt)):
                continue
            if any(isinstance(p, cst.Lambda) for p in self.ancestors(call)):
                continue
            done.add(id(stmt))
            test = divergent_condition(self.fm, stmt)
            if test is not None:
                # Under ``if not os.path.exists(p): <write> else: <read>``, the ranks that see
                # the file would wait in the barrier for those that do not: a deadlock.
                self.record(
                    call,
                    f"reads {path}, which rank 0 alone writes, under `"
                    f"{self.module.code_for_node(test)}`, which can differ between ranks: a "
                    f"barrier there would deadlock. Write it on rank 0, then call "
                    f"{self.sdp}.barrier() where every rank passes, then read it",
                    manual=True,
                )
                continue
            barrier = cst.parse_statement(f"{self.sdp}.barrier()\n")
            # The blank lines above the read go above the barrier (its comments stay with it).
            leading = list(getattr(stmt, "leading_lines", ()))
            blank = len(leading) - len(list(itertools.dropwhile(_is_blank, leading)))
            if blank:
                barrier = barrier.with_changes(leading_lines=leading[:blank])
                self._strip[stmt] = blank
            self.insert_before(stmt, barrier)
            if self.sdp == "sdp" or self.state.info.convertible:
                self.add_runtime_import()
            self.record(
                call,
                f"{self.sdp}.barrier() before reading {path}: rank 0 alone writes it",
            )

    def _wait_for_copies(self) -> None:
        """Every rank waits where rank 0 alone has copied files (a data set's folder)."""
        body = list(self.module.body)
        for stmt in copies_waited_for(self.fm, self.calls_to(*COPIES), self._on_rank0_only):
            i = body.index(stmt)
            if i + 1 < len(body) and is_barrier(self.fm, body[i + 1]):
                continue
            self.insert_after(stmt, cst.parse_statement(f"{self.sdp}.barrier()\n"))
            if self.sdp == "sdp" or self.state.info.convertible:
                self.add_runtime_import()
            self.record(stmt, f"{self.sdp}.barrier() after this: rank 0 alone copies the files it "
                        "makes, which every rank may read next")

    def _on_rank0_only(self, node: cst.CSTNode) -> bool:
        guarded = self.state.edits.guarded
        return (
            any(p in guarded for p in self.ancestors(node))
            or rank0_only(self.fm, node)
            or only_called_on_rank0(self.fm, node)
        )

    def _previous(self, stmt: cst.CSTNode) -> cst.CSTNode | None:
        parent = self.parent(stmt)
        body = getattr(parent, "body", None)
        if not isinstance(body, (list, tuple)):
            return None
        index = next((i for i, s in enumerate(body) if s is stmt), 0)
        if index > 0:
            return body[index - 1]
        # The first statement of ``with sdp.rank0_first():`` (order_downloads' block, around a
        # read that also downloads): what comes before the block comes before it.
        block = self.parent(parent) if parent is not None else None
        if isinstance(block, cst.With) and any(
            isinstance(i.item, cst.Call) and self.refers_to(
                i.item.func, f"{self.state.runtime_module}.rank0_first")
            for i in block.items
        ):
            return self._previous(block)
        return None

    def _stripped(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
        blank = self._strip.get(original)
        if not blank:
            return updated
        return updated.with_changes(leading_lines=updated.leading_lines[blank:])  # type: ignore

    def leave_SimpleStatementLine(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        return self._stripped(original_node, updated_node)

    def leave_With(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        return self._stripped(original_node, updated_node)

    def leave_If(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        return self._stripped(original_node, updated_node)

    def leave_For(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        return self._stripped(original_node, updated_node)

    def leave_Try(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        return self._stripped(original_node, updated_node)


def _is_blank(line: cst.EmptyLine) -> bool:
    return line.comment is None
