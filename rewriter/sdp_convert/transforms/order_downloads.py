"""Download datasets on each machine's local rank 0 first, the other ranks after it.

Before::

    train_set = datasets.MNIST("../data", train=True, download=True, transform=transform)
    (x_train, y_train), _ = keras.datasets.mnist.load_data()

After::

    with sdp.rank0_first():
        train_set = datasets.MNIST("../data", train=True, download=True, transform=transform)
    with sdp.rank0_first():
        (x_train, y_train), _ = keras.datasets.mnist.load_data()

Why: every rank runs the script, so every rank would download and unpack the same files into the
same directory at once: partial files read by another rank, archives unpacked twice over each
other. ``sdp.rank0_first()`` lets each machine's local rank 0 run the statement first while the
others wait; they then run it too and find the files in place (Accelerate's
``main_process_first()``, Lightning's ``prepare_data``). Downloads are ``torchvision.datasets``
classes with ``download=True`` (and their ``download_url``/``download_and_extract_archive``),
``keras.datasets.*.load_data()`` (also through a name: ``mnist = keras.datasets.mnist``),
``keras.utils.get_file``, ``tfds.load``, ``datasets.load_dataset``,
pretrained weights (Keras applications unless ``weights=None``, torchvision models with
``weights=``/``pretrained=True``, ``timm.create_model(pretrained=True)``, ``torch.hub``), Hugging
Face ``from_pretrained`` and ``torchtext.datasets`` (the legacy classes' ``splits``/``iters``
without ``path=`` and ``download``, torchtext >= 0.12's functions; not a legacy constructor given
its local files, ``TranslationDataset(path=..., fields=...)``, which only reads). A statement
inside a function runs when the function is called, after ``init()``; at module level of a
module without an entry point it would run at import, before any ``init()``, so it is reported
instead.

Downloads and extractions that rewrite their files each time they run (``urlretrieve``,
``gdown.download``, ``extractall``, ``requests.get`` whose content is written; see
``program.fetches``) go to rank 0 alone, followed by ``sdp.barrier()``: after a
``rank0_first()`` the other ranks would rewrite the files rank 0 is reading::

    if sdp.rank() == 0:
        response = requests.get(URL)
        with open(path, "wb") as f:
            f.write(response.content)
        zipfile.ZipFile(archive).extractall(root)
    sdp.barrier()

Reads of a URL into memory (``pd.read_csv(URL)``) get a note; ``np.loadtxt(URL)``, which caches
the download in the working directory on every rank, a manual one.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from ..program.builders import runs_right_before
from ..program.deletions import next_statement
from ..program.fetches import (
    fetch_unit,
    file_fetches,
    is_response,
    url_cache_reads,
    url_reads,
)
from ..program.keras import keras_name
from ..program.project import repairs_of
from ..program.ranks import only_called_on_rank0, rank0_only
from ..program.scopes import assigned_values
from ..program.syntax import arg_named, is_false
from ..program.vocab import (
    CACHED_DOWNLOAD_PREFIXES,
    CACHED_DOWNLOADS,
    TORCHTEXT_DATASETS,
    TORCHTEXT_DOWNLOADING_METHODS,
    TORCHTEXT_LOCAL_ARGUMENTS,
    TORCHTEXT_LOCAL_READERS,
)


class OrderDownloads(Transform):
    DESCRIPTION = "Run dataset downloads on each machine's local rank 0 first (sdp.rank0_first())."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})
    #: Project mode: a module that trains nothing (a data module) downloading on every rank at
    #: once (the whole-program contract's repair).
    PROJECT_ROLES = frozenset({"repair:fetch"})

    def prepare(self, module: cst.Module) -> None:
        done: set[cst.CSTNode] = set()
        asked = [node for _, node in repairs_of(self.fm, "fetch")]
        units: list[list[cst.BaseStatement]] = []
        found = [call for qname, calls in self.state.info.calls.items()
                 if _downloads(qname) for call in calls if _fetches(qname, call)]
        if not self.state.info.training:
            # A data module: only what the contract found downloading on every rank (a
            # download -> extract sequence goes to rank 0 whole, first).
            for call in file_fetches(self.fm):
                if any(call is node for node in asked) and not self._rank0(call):
                    self._rank0_then_barrier(call, done, units)
            self._barriers(units)
            found = [call for call in [*found, *self._aliased_load_data()]
                     if any(call is node for node in asked)]
            for call in sorted(found, key=self._order):
                stmt = self.enclosing_statement(call)
                if stmt is not None and stmt not in done:
                    done.add(stmt)
                    self._plan(call, stmt, stmt, None)
            return
        for call in sorted([*found, *self._aliased_load_data()], key=self._order):
            stmt = self.enclosing_statement(call)
            # A dataset built inside a call that shard_dataloader moved into a statement of
            # its own (``train_dataset = MNIST(...)`` before the loader): that statement
            # downloads now, and is the one to run first on local rank 0.
            around = self.hoisted_around(call)
            target = self.state.edits.hoisted[around] if around is not None else stmt
            if stmt is None or target in done:
                continue
            done.add(target)
            self._plan(call, stmt, target, around)
        for call in file_fetches(self.fm):
            if not self._rank0(call):
                self._rank0_then_barrier(call, done, units)
        self._barriers(units)
        for call in url_reads(self.fm):
            self.record(call, f"{self.module.code_for_node(call.func)}(...) reads over the "
                              "network on every rank (each downloads it; right, but N downloads):"
                              " to download once, save it on rank 0 first and read the file")
        for call in url_cache_reads(self.fm):
            what = self.module.code_for_node(call.func)
            self.record(call, f"{what}(URL) downloads into ./<host>/<path> of the working "
                              "directory first, on every rank at once (the same file): download it "
                              f"on rank 0 only (if {self.sdp}.rank() == 0: urllib.request."
                              f"urlretrieve(URL, path)), then {self.sdp}.barrier(), and give "
                              f"{what} the path", manual=True)

    def _rank0(self, call: cst.Call) -> bool:
        """Already on rank 0 alone, or in a ``rank0_first()``."""
        return rank0_only(self.fm, call) or only_called_on_rank0(self.fm, call) or (
            self._inside_rank0_first(call))

    def _barriers(self, units: list[list[cst.BaseStatement]]) -> None:
        """One barrier after consecutive units (they share one ``if``)."""
        firsts = {id(unit[0]) for unit in units}
        for unit in units:
            if id(next_statement(self.fm, unit[-1])) not in firsts:
                self.insert_after(unit[-1], cst.parse_statement(f"{self.sdp}.barrier()\n"))

    def _rank0_then_barrier(
        self, call: cst.Call, done: set[cst.CSTNode], units: list[list[cst.BaseStatement]]
    ) -> None:
        """A download or extraction that writes its files every time: rank 0 alone, then every
        rank waits (``program.fetches``)."""
        func = call.func
        what = self.module.code_for_node(func)
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call):
            what = f"{self.module.code_for_node(func.value.func)}(...).{func.attr.value}"
        unit = fetch_unit(self.fm, call)
        how = "writes what it downloads" if is_response(self.fm, call) else (
            "unpacks" if what.endswith(("extractall", "extract")) or "unpack" in what
            else "downloads")
        if unit.problem is not None or not unit.barrier or (
            self.enclosing_function(call) is None and not self.state.info.entry_point
        ):
            why = unit.problem or ("the ranks may not all get to a barrier after it"
                                   if not unit.barrier else "it runs at import, before init()")
            self.record(call, f"{what}(...) {how} on every rank at once, into the same files "
                              f"({why}): run it on rank 0 only (if {self.sdp}.rank() == 0:), "
                              f"then {self.sdp}.barrier() where every rank passes", manual=True)
            return
        if any(s in done for s in unit.statements):
            return
        done.update(unit.statements)
        self.add_runtime_import()
        for stmt in unit.statements:
            self.guard_rank0(stmt)
        units.append(unit.statements)
        self.record(call, f"{what}(...) {how} on rank 0 only, then {self.sdp}.barrier(): the "
                          "other ranks read the files once they are whole (each rank wrote the "
                          "same files at once before)")

    def _plan(
        self,
        call: cst.Call,
        stmt: cst.BaseStatement,
        target: cst.BaseStatement,
        around: cst.CSTNode | None,
    ) -> None:
        if rank0_only(self.fm, call) or self._inside_rank0_first(stmt):
            return
        what = self.module.code_for_node(call.func)
        if not isinstance(target, cst.SimpleStatementLine) or not runs_right_before(
            self.fm, call, around if around is not None else stmt
        ):
            self.record(
                call,
                f"{what}(...) downloads on every rank at once: run it in `with "
                f"{self.sdp}.rank0_first():` (local rank 0 first, the others after it)",
                manual=True,
            )
            return
        if self.enclosing_function(stmt) is None and not self.state.info.entry_point:
            self.record(
                call,
                f"{what}(...) downloads at import, before sdp.init(): move it into a function, "
                f"under `with {self.sdp}.rank0_first():`",
                manual=True,
            )
            return
        self.add_runtime_import()
        self.run_rank0_first(target)
        self.record(
            call,
            f"{what}(...) downloads on each machine's local rank 0 first, then on the other "
            f"ranks, which find its files (with {self.sdp}.rank0_first())",
        )

    def _aliased_load_data(self) -> list[cst.Call]:
        """``mnist = tf.keras.datasets.mnist`` then ``mnist.load_data()``."""
        found = []
        for call in self.method_calls("load_data"):
            receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
            if isinstance(receiver, cst.Name) and any(
                (k := keras_name(q)) is not None and k.startswith("keras.datasets.")
                for value in assigned_values(self.fm, receiver)
                for q in self.qualified_names(value)
            ):
                found.append(call)
        return found

    def _inside_rank0_first(self, stmt: cst.CSTNode) -> bool:
        for parent in self.ancestors(stmt):
            if isinstance(parent, cst.With) and any(
                isinstance(item.item, cst.Call)
                and self.refers_to(item.item.func, f"{self.state.runtime_module}.rank0_first")
                for item in parent.items
            ):
                return True
        return False


def _downloads(qname: str) -> bool:
    """A call that may fetch files over the network into a cache or directory shared by the
    processes of a machine (``_fetches`` looks at its arguments)."""
    if qname in CACHED_DOWNLOADS or qname.startswith(CACHED_DOWNLOAD_PREFIXES):
        return True
    if qname.startswith(("transformers.", "diffusers.", "sentence_transformers.")) and \
            qname.endswith(".from_pretrained"):
        return True
    name = keras_name(qname)
    return name is not None and (
        name == "keras.utils.get_file"
        or (name.startswith("keras.datasets.") and name.endswith(".load_data"))
        or name.startswith("keras.applications.")
    )


def _fetches(qname: str, call: cst.Call) -> bool:
    """Whether this call of a ``_downloads`` name downloads, by its arguments: a torchvision
    dataset with ``download=True``, a model with pretrained weights (torchvision ``weights=`` or
    ``pretrained=True``, Keras applications' default ``weights="imagenet"``, timm)."""
    if qname.startswith("torchvision.datasets.") and not qname.startswith(
        "torchvision.datasets.utils."
    ):
        download = arg_named(call, "download")
        return download is not None and not is_false(download.value)
    if qname.startswith(("torchvision.models.", "timm.create_model")):
        weights, pretrained = arg_named(call, "weights"), arg_named(call, "pretrained")
        return (weights is not None and not m.matches(weights.value, m.Name("None"))) or (
            pretrained is not None and not is_false(pretrained.value))
    if qname.startswith(TORCHTEXT_DATASETS):
        return _torchtext_fetches(qname, call)
    name = keras_name(qname)
    if name is not None and name.startswith("keras.applications."):
        if not name.rsplit(".", 1)[-1][:1].isupper():
            return False  # preprocess_input, decode_predictions: no weights
        weights = arg_named(call, "weights")
        return weights is None or not m.matches(weights.value, m.Name("None"))
    return True


def _torchtext_fetches(qname: str, call: cst.Call) -> bool:
    """A torchtext dataset call that downloads: a legacy class's ``splits``/``iters`` without
    ``path=`` and its ``download``, or a function of torchtext >= 0.12; never the constructor of
    a legacy class given the local files it reads (``TranslationDataset(path=..., fields=...)``)."""
    prefix = next(p for p in TORCHTEXT_DATASETS if qname.startswith(p))
    parts = qname[len(prefix):].split(".")
    if len(parts) > 1:
        method = parts[-1]
        if method in TORCHTEXT_DOWNLOADING_METHODS:
            return arg_named(call, "path") is None
        return method == "download"
    return parts[0] not in TORCHTEXT_LOCAL_READERS and not any(
        arg_named(call, name) is not None for name in TORCHTEXT_LOCAL_ARGUMENTS)
