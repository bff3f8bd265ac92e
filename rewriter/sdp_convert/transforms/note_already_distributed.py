"""Leave an already distributed script alone, saying what distributes it.

Before::

    import deepspeed

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config)

After: the same bytes, and one report entry::

    train.py:1:1: [note_already_distributed] left unchanged: already distributed with DeepSpeed

Why: torch DDP/FSDP with ``init_process_group``, ``tf.distribute`` strategies, DeepSpeed,
Accelerate and Lightning scripts, and scripts that set up distribution with their own code (any
``torch.distributed`` call, a ``DistributedSampler``, ``LOCAL_RANK``/``RANK``/``WORLD_SIZE`` read
from the environment, ``args.distributed``/``args.local_rank``, an import of
``torch.distributed.run``) already average gradients, shard data and start every rank from
the same weights; adding sdp_runtime on top would do it twice. Such a file is left byte for byte
as it is (a second ``init`` would fail: "trying to initialize the default process group twice"),
but the report says why nothing happened, so that an unchanged file is never mistaken
for one the converter did not understand. Where that distribution sits behind a flag that is
off by default (``if args.local_rank != -1:`` with ``--local_rank`` defaulting to -1, a
``store_true`` ``--distributed``, ``hparams.distributed_run=False``), the note names the flag
and the launch that turns it on (``program.launch``): "as before" would be one process.
(Horovod and SMDDP scripts are migrated instead, by
``migrate_horovod`` and ``migrate_smddp``.) A program that is parallel another way,
``torch.multiprocessing`` workers sharing one model (``share_memory()``, Hogwild), is left alone
the same way: data parallelism over it would be a second, conflicting parallelism.
Keras 3's own data parallelism
(``keras.distribution.DataParallel``) counts as distributed. A Keras script that picks the JAX or
torch backend (``os.environ["KERAS_BACKEND"] = "jax"`` before ``import keras``,
``keras.config.set_backend``) is left alone too, with a manual note: ``sdp_runtime.tensorflow``'s
optimizer, tape and callbacks work on TensorFlow tensors only.
"""

from __future__ import annotations

import libcst as cst

from ..analysis import FileInfo, Visitor
from ..base import Transform
from ..program.launch import distribution_condition, distribution_switch
from ..program.syntax import walk

#: What each library is called in the note, by the calls and the imports that show it.
_CALLS = {
    "torch.distributed.init_process_group": "torch.distributed",
    "torch.nn.parallel.DistributedDataParallel": "torch DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel": "torch DistributedDataParallel",
    "torch.distributed.fsdp.FullyShardedDataParallel": "torch FSDP",
}
_IMPORTS = {
    "deepspeed": "DeepSpeed",
    "accelerate": "Hugging Face Accelerate",
    "lightning": "PyTorch Lightning",
    "pytorch_lightning": "PyTorch Lightning",
    "torch.distributed.fsdp": "torch FSDP",
    "fairscale": "FairScale",
    "colossalai": "ColossalAI",
}
_STRATEGIES = "tensorflow.distribute."


class NoteAlreadyDistributed(Transform):
    DESCRIPTION = "Leave already distributed scripts (DDP, tf.distribute, DeepSpeed, ...) alone."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})

    @classmethod
    def applies_to(cls, info: FileInfo) -> bool:
        return info.origin == "distributed" or info.excluded.startswith("Keras on the")

    def prepare(self, module: cst.Module) -> None:
        info = self.state.info
        if info.origin != "distributed":
            # Keras on JAX or torch: the TF runtime's optimizer, tape and callbacks cannot serve it.
            self.record(module, f"not converted: {info.reason}", manual=True)
            return
        # (label, node that shows it), the reason analysis gave first.
        found: list[tuple[str, cst.CSTNode]] = []
        for qname, label in _CALLS.items():
            calls = self.calls_to(qname)
            if calls:
                found.append((label, calls[0]))
        for qname in sorted(q for q in info.calls if q.startswith(_STRATEGIES)):
            if qname.endswith("Strategy"):
                found.append(("tf" + qname[len("tensorflow"):], self.calls_to(qname)[0]))
        finder = _ImportFinder(tuple(_IMPORTS))
        walk(module, finder)
        found += [(_IMPORTS[package], node) for package, node in finder.found]
        if info.reason not in {label for label, _ in found}:
            # Set up by the script's own code (a torch.distributed call, a launcher's
            # variables, args.local_rank, Hogwild workers): the construct analysis found.
            found.append((info.reason, info.distributed_at or module))
        found.sort(key=lambda item: item[0] != info.reason)
        labels = list(dict.fromkeys(label for label, _ in found)) or [info.reason]
        switch = next((s for _, node in found if (s := distribution_switch(self.fm, node))),
                      None)
        if switch is None:
            # Behind a test whose value as usually started the converter cannot read: said so,
            # never "distributed as launched".
            condition = next((c for _, node in found
                              if (c := distribution_condition(self.fm, node))), None)
            self.record(found[0][1] if found else module, f"left unchanged: already distributed "
                        f"with {' + '.join(labels)}" + (
                            f", but only when `{condition}`, whose value as the script is "
                            "usually started is unknown here (if it is false, it runs on one "
                            "process): launch it so that it holds" if condition else
                            "; launch it as before"))
            return
        # Its distribution is off by default: "as before" is one process (no strategy).
        self.record(
            found[0][1],
            f"left unchanged: already distributed with {' + '.join(labels)}, but only when "
            f"`{switch.test}` ({switch.flag} is {switch.default} by default{switch.derived}: "
            f"started as usual, it runs " + (
                f"without its strategy); to use it, start it with {switch.launch}"
                if switch.strategy else
                f"on one process); to run it on N processes, launch it with {switch.launch}"),
        )


class _ImportFinder(Visitor):
    """The first import of each of ``packages`` (or of something under it)."""

    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages
        self.found: list[tuple[str, cst.CSTNode]] = []

    def _note(self, name: str, node: cst.CSTNode) -> None:
        # The longest matching package: torch.distributed.fsdp, not torch.
        for package in sorted(self.packages, key=len, reverse=True):
            if name == package or name.startswith(package + "."):
                if package not in {p for p, _ in self.found}:
                    self.found.append((package, node))
                return

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            self._note(cst.helpers.get_full_name_for_node(alias.name) or "", node)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.module is not None and not node.relative:
            self._note(cst.helpers.get_full_name_for_node(node.module) or "", node)
        return False
