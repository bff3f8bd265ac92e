"""``sdp-run --output-dir DIR``: each rank's output in ``DIR/rank<N>.stdout`` / ``.stderr``.

A torchrun ``LogsSpecs`` (registered as the ``torchrun.logs_specs`` entry point
``sdp-rank-files`` in pyproject.toml, which torchrun's ``--logs-specs`` loads): torchrun's own
layout (``--log-dir``) nests files by run id, attempt and local rank; here the file is named by
the global rank, flat, and written as the rank runs. A restart after a failure
(``--max-restarts``) writes ``rank<N>.attempt<k>.stdout``. Imported only by torchrun, in
``sdp-run``, so importing torch here costs nothing elsewhere.
"""

from __future__ import annotations

import os

from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, LogsDest


class RankFiles(DefaultLogsSpecs):
    """torchrun's default logs, with each rank's streams moved to ``$SDP_RUN_OUTPUT_DIR``."""

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        folder = os.environ.get("SDP_RUN_OUTPUT_DIR")
        if not folder:
            return dest
        for local_rank, env in envs.items():
            rank = env.get("RANK", str(local_rank))
            attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
            stem = f"rank{rank}" if attempt == "0" else f"rank{rank}.attempt{attempt}"
            for kind, files, tees in (("stdout", dest.stdouts, dest.tee_stdouts),
                                      ("stderr", dest.stderrs, dest.tee_stderrs)):
                if not files.get(local_rank):
                    continue  # not redirected: nothing to move
                path = os.path.join(folder, f"{stem}.{kind}")
                files[local_rank] = path
                if local_rank in tees:
                    tees[local_rank] = path
        return dest
