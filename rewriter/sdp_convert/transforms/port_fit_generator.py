"""Port ``fit_generator`` to ``fit`` (Keras 3 removed it), and shard ``ImageDataGenerator.flow``.

Before::

    datagen = ImageDataGenerator(width_shift_range=0.1, horizontal_flip=True)
    model.fit_generator(datagen.flow(x_train, y_train, batch_size=32), 1000, epochs=10, workers=4)

After::

    datagen = ImageDataGenerator(width_shift_range=0.1, horizontal_flip=True)
    model.fit(
        datagen.flow(sdp.shard(x_train), sdp.shard(y_train), batch_size=32),
        steps_per_epoch=1000, epochs=10,
    )

Why: Keras 3 has no ``fit_generator`` (``fit`` takes generators), so a script that calls it
fails before training; as ``fit`` it gets everything ``wrap_keras_fit`` gives a fit (callbacks,
``DistributedOptimizer``, rank-0 output and checkpoints, ``steps_per_epoch`` per worker). The
arguments after the generator are written as keywords, since ``fit``'s positions differ
(``fit_generator(gen, 1000)`` means ``steps_per_epoch=1000``, ``fit(gen, 1000)`` would be
``y``); ``max_queue_size``, ``workers`` and ``use_multiprocessing`` are dropped (Keras 3's
``fit`` refuses them; they belong to a ``PyDataset``). The arrays an ``ImageDataGenerator``
flows into training are sharded with ``sdp.shard`` (every ``size()``-th sample from ``rank()`` on,
padded to the same length on every worker), as ``fit(x, y)`` arrays are; a flow the converter
cannot read (a list of arrays, no labels) is reported.

The iterator of files an ``ImageDataGenerator`` makes (``flow_from_directory``,
``flow_from_dataframe``) that ``fit`` trains on is sharded at the fit by ``wrap_keras_fit``
(``sdp.shard(train_gen)``: every ``size()``-th batch from ``rank()`` on); its order must then be
the same on every worker, so one that shuffles (the default) without a ``seed=`` gets
``seed=sdp.shared_seed()`` here (rank 0's seed, new each run; ``sdp.shard`` seeds its
``on_epoch_end`` reshuffles alike as well).

A Horovod or SMDDP Keras script being migrated gets the port too (Keras 3 lacks
``fit_generator`` there as well), but not the sharding: how such a script splits its data is its
own, and the migration's checks speak about it.
"""

from __future__ import annotations

import libcst as cst

from ..analysis import FileInfo
from ..base import Transform
from ..program.keras import (
    FIT_GENERATOR_PARAMETERS,
    generator_flow,
    image_iterator,
    is_fit_generator,
    iterator_seeded,
    keras_fit_calls,
)
from ..program.sharding import fit_arrays, flow_arg
from ..program.syntax import add_keyword, code, replace_arg
from ..program.tfshards import fit_inputs_to_split

#: ``fit_generator`` arguments Keras 3's ``fit`` does not take.
_DROPPED = ("max_queue_size", "workers", "use_multiprocessing")


class PortFitGenerator(Transform):
    DESCRIPTION = "fit_generator -> fit (Keras 3); shard the arrays an ImageDataGenerator flows."
    FRAMEWORKS = frozenset({"tensorflow"})
    #: Scripts of these libraries are migrated, not converted: their fit_generator is ported all
    #: the same.
    MIGRATED = frozenset({"horovod", "smddp"})

    @classmethod
    def applies_to(cls, info: FileInfo) -> bool:
        migrated = info.origin in cls.MIGRATED
        return info.framework in cls.FRAMEWORKS and (info.convertible or migrated)

    def prepare(self, module: cst.Module) -> None:
        self.ports: set[cst.Call] = set()
        self.flows: dict[cst.Call, list[str]] = {}  # flow call -> keywords of arrays to shard
        self.seeds: set[cst.Call] = set()  # flow_from_* calls to give the workers' shared seed
        migrated = not self.state.info.convertible
        for fit in keras_fit_calls(self.fm):
            if is_fit_generator(fit):
                self.ports.add(fit)
            if migrated:
                continue
            iterator = image_iterator(self.fm, fit)
            if iterator is not None and iterator_seeded(iterator) is False and (
                fit_inputs_to_split(self.fm, fit) is not None
            ):
                self.seeds.add(iterator)
                self.add_runtime_import()
            flow = generator_flow(self.fm, fit)
            if flow is None or flow in self.flows:
                continue
            status, arg = fit_arrays(self.fm, flow, flow=True)
            if status == "plain":
                keywords = ["x", "y"]
                if flow_arg(flow, "sample_weight") is not None:
                    keywords.append("sample_weight")
                self.flows[flow] = keywords
                self.add_runtime_import()
            elif status != "sharded":
                self.record(
                    arg.value if arg is not None else flow,
                    f"training data from {code(flow.func)}(...) not sharded: give each worker "
                    f"every {self.sdp}.size()-th sample from {self.sdp}.rank() on "
                    f"({self.sdp}.shard(x) of each array), or use a tf.data dataset",
                    manual=True,
                )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self.seeds:
            self.record(
                original_node,
                f"seed={self.sdp}.shared_seed(): the iterator shuffles its files, and each worker "
                f"reads every {self.sdp}.size()-th batch of it, so its order must be the same on "
                "every worker (rank 0's seed, new each run)",
            )
            seed = cst.parse_expression(f"{self.sdp}.shared_seed()")
            return add_keyword(updated_node, "seed", seed, first=False)
        if original_node in self.flows:
            return self._shard(original_node, updated_node)
        if original_node in self.ports:
            return self._port(original_node, updated_node)
        return updated_node

    def _shard(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        keywords = self.flows[original]
        for keyword in keywords:
            arg = flow_arg(updated, keyword)
            assert arg is not None
            shard = cst.Call(
                func=cst.parse_expression(f"{self.sdp}.shard"), args=[cst.Arg(arg.value)]
            )
            updated = replace_arg(updated, arg, shard)
        names = ", ".join(code(a.value) for k in keywords if (a := flow_arg(original, k)))
        self.record(
            original,
            f"{names}: each worker augments and trains on every {self.sdp}.size()-th sample from "
            f"{self.sdp}.rank() on (sdp.shard: the same number on every worker; batch_size is per "
            "worker)",
        )
        return updated

    def _port(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        assert isinstance(updated.func, cst.Attribute)
        args: list[cst.Arg] = []
        dropped: list[str] = []
        for i, arg in enumerate(updated.args):
            name = arg.keyword.value if arg.keyword is not None else None
            if name is None and not arg.star and 0 < i < len(FIT_GENERATOR_PARAMETERS):
                name = FIT_GENERATOR_PARAMETERS[i]
                arg = arg.with_changes(
                    keyword=cst.Name(name),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""),
                        whitespace_after=cst.SimpleWhitespace(""),
                    ),
                )
            if name in _DROPPED:
                dropped.append(f"{name}={code(arg.value)}")
                continue
            if name == "generator":
                arg = arg.with_changes(keyword=cst.Name("x"))
            args.append(arg)
        if args and updated.args and args[-1].comma != updated.args[-1].comma:
            args[-1] = args[-1].with_changes(comma=updated.args[-1].comma)
        gone = (
            f"; {', '.join(dropped)} dropped (Keras 3's fit takes none of them)" if dropped else ""
        )
        self.record(
            original,
            f"fit_generator(...) -> fit(...): Keras 3 removed fit_generator, and fit takes "
            f"generators{gone}",
        )
        return updated.with_changes(
            func=updated.func.with_changes(attr=cst.Name("fit")), args=args
        )
