"""Import the runtime and initialise it once, right after the imports.

Before::

    import torch
    import torch.nn as nn

    model = nn.Linear(10, 1)

After::

    import torch
    import torch.nn as nn
    import sdp_runtime.torch as sdp
    sdp.init()

    model = nn.Linear(10, 1)

Why: every later step of the recipe (GPU pinning, sharding, lr scaling, rank-0 writes) asks the
runtime for this process's rank, local rank and world size, which exist only after ``init()``.
Calling it at import time, after the file's own imports, puts it before any use of the rank. With no
launcher the runtime runs as rank 0 of 1, so ``python train.py`` keeps working.

Environment settings among the imports (``import os``, ``os.environ["KERAS_BACKEND"] = ...``,
``os.environ["OMP_NUM_THREADS"] = ...``, then ``import keras``) stay before the runtime: importing
it starts TensorFlow (or torch) and ``init()`` makes the process group, and both read the
environment when they start. The import and ``init()`` then go after the last of those imports
and settings.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from ..program.project import repairs_of
from ..program.syntax import end_of_import_block, first_import_block_end


class AddRuntimeInit(Transform):
    DESCRIPTION = "Import sdp_runtime and call init() once, after the file's imports."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})
    #: Project mode: the entry point that runs another module's training code (``entry``:
    #: found by the project planning, or asked by the whole-program contract's ``init`` repair).
    #: A module that trains nothing but gets runtime calls (``helper``, ``data``, writes and
    #: downloads the whole-program contract asks of it): only ``init()`` in its own
    #: ``if __name__ == "__main__":`` block, for when it is run as a script.
    PROJECT_ROLES = frozenset({"entry", "helper", "data", "repair:guard_write", "repair:fetch"})

    def prepare(self, module: cst.Module) -> None:
        self.anchor: cst.BaseStatement | None = None
        self.already = False
        self.script_main: cst.If | None = None
        self.standalone = False
        # An init anywhere (in main(), say) counts: a second init() would raise.
        if self.calls_to(f"{self.state.runtime_module}.init"):
            self.already = True
            return
        project = self.state.options.project
        roles = project.roles if project is not None else frozenset()
        if not self.state.info.training and not roles & {"entry", "repair:init"}:
            # Here for the runtime calls other transforms give a module that trains nothing
            # (a helper's writes, a data module's sampler): imported, the entry initialises.
            self.script_main = _main_block(module)
            if self.script_main is not None or not self.state.info.entry_point or roles & {
                "helper", "data"
            }:
                self.already = True
                return
            # A script of its own that no training module imports (an evaluation script whose
            # writes the contract guards): it initialises after its imports, as an entry does.
            self.standalone = True
        if not self.state.info.entry_point:
            self.already = True
            if project is not None and (project.started_by or repairs_of(self.fm, "started_by")):
                # The entry point that runs this module's code initialises; run as a script of
                # its own (``if __name__ == "__main__":``), the module initialises there, or its
                # converted code stops at the first sdp.rank().
                self.script_main = _main_block(module)
                return
            self.record(
                module,
                f"no sdp.init() added: nothing in this module runs its training code (it is "
                f"imported and called by another); call {self.state.runtime_module}.init() once, "
                "at the start of the script that runs it, before this module's functions",
                manual=True,
            )
            return
        self.anchor = end_of_import_block(module)
        first = first_import_block_end(module)
        #: The block runs on past the imports that open the file (environment settings, then more
        #: imports): libcst would add the runtime import at the end of those, before the settings.
        self.late = first is not None and self.anchor is not None and self.anchor is not first

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self.standalone and not any(
            not manual and transform != self.NAME for _, transform, _, manual in self.state.records
        ):
            return updated_node  # nothing else changed: no runtime to initialise
        if self.already:
            main = self.script_main
            if main is not None and isinstance(main.body, cst.IndentedBlock) and any(
                not manual and transform != self.NAME for _, transform, _, manual in
                self.state.records
            ):
                self.add_runtime_import()
                init = cst.parse_statement(f"{self.sdp}.init()\n")
                # Its block was left already (the edit plan of nested blocks is applied on the
                # way up): the init goes into the updated block, the module's last step.
                body = list(updated_node.body)
                for at, stmt in enumerate(body):
                    if m.matches(stmt, _MAIN):
                        assert isinstance(stmt, cst.If) and isinstance(stmt.body, cst.IndentedBlock)
                        body[at] = stmt.with_changes(body=stmt.body.with_changes(
                            body=[init, *stmt.body.body]))
                        updated_node = updated_node.with_changes(body=body)
                        break
                self.record(main, f"{self.sdp}.init() first in its `if __name__ == \"__main__\":` "
                            "block: run as a script of its own, it initialises the runtime its "
                            "converted code reads (imported, the entry point initialises it)")
            return updated_node
        self.add_runtime_import()
        init = cst.parse_statement(f"{self.sdp}.init()\n")
        if self.anchor is None:
            # No import block at the top (rare): initialise first thing after the docstring.
            # Through the edit plan, as the other transforms' statements go: inserting into the
            # body here would shift it against the original statements their edits are keyed on.
            body = list(original_node.body)
            docstring = m.SimpleStatementLine([m.Expr(m.SimpleString())])
            at = 1 if body and m.matches(body[0], docstring) else 0
            if at < len(body):
                self.state.edits.before.setdefault(body[at], []).insert(0, init)
            else:
                self.insert_after(body[-1], init)
            self.record(
                original_node,
                f"import {self.state.runtime_module} as {self.sdp}; {self.sdp}.init()",
            )
            return updated_node
        if self.late:
            # The engine sees this import and schedules no second one at the top.
            runtime = cst.parse_statement(
                f"import {self.state.runtime_module} as {self.sdp}\n",
                config=original_node.config_for_parsing,
            ).with_changes(leading_lines=[cst.EmptyLine()])
            init = init.with_changes(leading_lines=[cst.EmptyLine()])
            self.insert_after(self.anchor, runtime, init)
        else:
            self.insert_after(self.anchor, init)
        asked = repairs_of(self.fm, "init")
        runs = (
            f" (it runs the training code of {', '.join(project.starts)})"
            if (project := self.state.options.project) is not None and project.starts
            else f" (it runs the training in {asked[0][0].detail})" if asked
            else ""
        )
        self.record(
            self.anchor,
            f"import {self.state.runtime_module} as {self.sdp} and call {self.sdp}.init(){runs}",
        )
        return updated_node


#: ``if __name__ == "__main__":``
_MAIN = m.If(test=m.Comparison(
    left=m.Name("__name__"),
    comparisons=[m.ComparisonTarget(m.Equal(), m.SimpleString())],
))


def _main_block(module: cst.Module) -> cst.If | None:
    """The module's top-level ``if __name__ == "__main__":`` block."""
    for stmt in module.body:
        if m.matches(stmt, _MAIN):
            assert isinstance(stmt, cst.If)
            return stmt
    return None
