"""program.project: imports between the modules of one run, and what one module's conversion
learns from the others (the run's side is sdp_convert.projects)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import libcst.matchers as m
import pytest
from sdp_convert.base import Options
from sdp_convert.engine import convert
from sdp_convert.modules import imported_modules
from sdp_convert.program.project import (
    LoaderFeed,
    ModuleFacts,
    Project,
    ShardedSource,
    module_name,
    returned_by,
    training_results,
)
from sdp_convert.projects import project_options
from sdp_convert.siblings import neighbours, project_digest

from .helpers import find, probe


def tree(root: Path, files: dict[str, str]) -> dict[Path, bytes]:
    found = {}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        found[path] = path.read_bytes()
    return found


# -- import resolution -----------------------------------------------------------------------------


def test_module_names_follow_packages_src_layout_included(tmp_path: Path):
    files = tree(tmp_path, {"main.py": "", "src/pkg/__init__.py": "", "src/pkg/data.py": "",
                            "src/pkg/sub/__init__.py": "", "src/pkg/sub/x.py": ""})
    names = {p.relative_to(tmp_path).as_posix(): module_name(p) for p in files}
    assert names == {"main.py": "main", "src/pkg/__init__.py": "pkg", "src/pkg/data.py": "pkg.data",
                     "src/pkg/sub/__init__.py": "pkg.sub", "src/pkg/sub/x.py": "pkg.sub.x"}


@pytest.fixture
def project(tmp_path: Path) -> tuple[Project, Path]:
    files = tree(tmp_path, {
        "main.py": "",
        "data.py": "def get_loaders(): pass\nloaders = None\n",
        "src/pkg/__init__.py": "from .trainer import Trainer\nfrom .data import build as make\n",
        "src/pkg/trainer.py": "class Trainer: pass\n",
        "src/pkg/data.py": "def build(): pass\n",
    })
    return Project(files), tmp_path


@pytest.mark.parametrize(("spelled", "where", "want"), [
    ("data.get_loaders", "main.py", ("data.py", "get_loaders")),  # import data / from data ...
    ("pkg.trainer.Trainer", "main.py", ("src/pkg/trainer.py", "Trainer")),  # absolute, src/
    ("pkg.Trainer", "main.py", ("src/pkg/trainer.py", "Trainer")),  # re-exported by __init__
    ("pkg.make", "main.py", ("src/pkg/data.py", "build")),  # re-exported under another name
    (".data.build", "src/pkg/trainer.py", ("src/pkg/data.py", "build")),  # from .data import
    (".Trainer", "src/pkg/data.py", ("src/pkg/trainer.py", "Trainer")),  # from . import Trainer
])
def test_qualified_names_resolve_to_their_definitions(project, spelled, where, want):
    found, root = project
    target = found.resolve(root / where, spelled)
    assert target is not None
    assert (target[0].relative_to(root).as_posix(), target[1]) == want


@pytest.mark.parametrize(("spelled", "where"), [
    ("data.loaders", "main.py"),  # a variable, not a function: not followed
    ("data.missing", "main.py"),
    ("torch.utils.data.DataLoader", "main.py"),  # not a project module
    ("...too.far", "src/pkg/data.py"),  # above the top package
])
def test_what_is_not_a_project_definition_resolves_to_nothing(project, spelled, where):
    found, root = project
    assert found.resolve(root / where, spelled) is None


def test_two_files_that_would_be_the_same_module_resolve_to_neither(tmp_path: Path):
    files = tree(tmp_path, {"a/data.py": "def f(): pass\n", "b/data.py": "def f(): pass\n"})
    assert Project(files).resolve(tmp_path / "a" / "main.py", "data.f") is None


def test_neighbours_are_the_folder_its_packages_and_src(tmp_path: Path):
    tree(tmp_path, {"main.py": "", "data.py": "", "notes/x.py": "", "src/pkg/__init__.py": "",
                    "src/pkg/t.py": "", "pkg2/__init__.py": "", "pkg2/m.py": ""})
    found = {p.relative_to(tmp_path).as_posix() for p in neighbours([tmp_path / "main.py"])}
    assert found == {"main.py", "data.py", "src/pkg/__init__.py", "src/pkg/t.py",
                     "pkg2/__init__.py", "pkg2/m.py"}


# -- one module's questions ------------------------------------------------------------------------


def test_what_a_call_returns_is_followed_to_the_training_loop_element_by_element():
    t = probe("""
        import data
        import torch
        def main():
            train_loader, test_loader = data.get_loaders(32)
            for epoch in range(3):
                for x, y in train_loader:
                    loss = model(x).sum()
                    loss.backward()
                    opt.step()
            for x, y in test_loader:
                print(x)
    """)
    call = find(t, m.Call(func=m.Attribute(attr=m.Name("get_loaders"))))
    assert isinstance(call, cst.Call)
    assert [index for index, _ in training_results(t, call)] == [0]


def test_a_loader_returned_directly_or_through_a_name_or_in_a_tuple():
    t = probe("""
        from torch.utils.data import DataLoader
        def one(ds):
            return DataLoader(ds)
        def two(ds, other):
            train = DataLoader(ds, shuffle=True)
            return train, DataLoader(other)
        class Data:
            def loader(self, ds):
                return DataLoader(ds)
    """)
    calls = [n for n in m.findall(t.module, m.Call(func=m.Name("DataLoader")))
             if isinstance(n, cst.Call)]
    assert [returned_by(t, c) for c in calls] == [
        [("one", None)], [("two", 0)], [("two", 1)], [],  # a method is not a module function
    ]


# -- the run ---------------------------------------------------------------------------------------

DATA = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

def get_loaders(batch_size):
    train_set = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(train_set, batch_size=batch_size)
    return train_loader, test_loader
"""
MAIN = """\
import torch
import data

def main():
    train_loader, test_loader = data.get_loaders(16)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in train_loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

if __name__ == "__main__":
    main()
"""


def test_the_run_gives_each_module_the_facts_of_the_other(tmp_path: Path):
    tree(tmp_path, {"data.py": DATA, "main.py": MAIN, "notes.py": "x = 1\n"})
    chosen = project_options([(tmp_path / "data.py", "data.py"), (tmp_path / "main.py", "main.py")],
                             Options())
    data_facts = chosen[(tmp_path / "data.py").resolve()].project
    main_facts = chosen[(tmp_path / "main.py").resolve()].project
    assert data_facts is not None and main_facts is not None
    assert data_facts.feeds == (LoaderFeed("get_loaders", 0, "main.py:5"),)
    assert main_facts.sources == (ShardedSource("data.get_loaders", 0, "data.py:6", True),)
    # The run reads every other file of the project (a neighbour too): a cache keys on them.
    files = [(tmp_path / "data.py", "data.py"), (tmp_path / "main.py", "main.py")]
    before = project_digest(files)
    (tmp_path / "notes.py").write_text("x = 2\n")
    assert project_digest(files) != before


def test_a_module_given_alone_is_read_not_written(tmp_path: Path):
    tree(tmp_path, {"data.py": DATA, "main.py": MAIN})
    chosen = project_options([(tmp_path / "main.py", "main.py")], Options())
    facts = chosen[(tmp_path / "main.py").resolve()].project
    assert facts is not None and not facts.sources[0].sharded
    result = convert(MAIN, chosen[(tmp_path / "main.py").resolve()])
    notes = [c.message for c in result.changes if c.manual]
    assert any("sharded only if that module is converted in the same run" in n for n in notes)
    assert "sdp.size()" not in result.output.decode()  # learning rate not scaled


def test_a_data_module_gets_a_sampler_that_works_without_init_and_no_init():
    facts = ModuleFacts(feeds=(LoaderFeed("get_loaders", 0, "main.py:5"),))
    result = convert(DATA, Options(project=facts))
    out = result.output.decode()
    assert "sdp.init()" not in out
    assert "if sdp.is_initialized()\n        else torch.utils.data.RandomSampler(train_set)" in out
    assert "DataLoader(train_set, batch_size=batch_size, sampler=train_sampler)" in out
    assert "test_loader = DataLoader(train_set, batch_size=batch_size)" in out
    assert [c.format("data.py") for c in result.changes] == [
        "data.py:6:20: [shard_dataloader] give train_loader a DistributedSampler (train_sampler, "
        "shuffle=True) so that each rank reads its own shard (used by main.py:5)"
    ]
    assert [(e.function, e.index, e.line) for e in result.exports] == [("get_loaders", 0, 6)]
    # Without the fact, the module trains nothing: left alone.
    assert not convert(DATA, Options()).changed


def test_the_training_script_sets_the_epoch_and_scales_the_rate():
    facts = ModuleFacts(sources=(ShardedSource("data.get_loaders", 0, "data.py:6", True),))
    out = convert(MAIN, Options(project=facts)).output.decode()
    assert "    for epoch in range(2):\n        train_loader.sampler.set_epoch(epoch)\n" in out
    assert "lr=0.1 * sdp.size()" in out
    unshuffled = ModuleFacts(sources=(ShardedSource("data.get_loaders", 0, "data.py:6", False),))
    out = convert(MAIN, Options(project=unshuffled)).output.decode()
    assert "set_epoch" not in out and "lr=0.1 * sdp.size()" in out


def test_keras_callback_classes_that_write_files(tmp_path: Path):
    files = tree(tmp_path, {"callbacks.py": """
        import json
        import tensorflow as tf

        class Logger(tf.keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                with open("log.jsonl", "a") as f:
                    f.write(json.dumps(logs))

        class Saver(tf.keras.callbacks.Callback):
            def on_train_end(self, logs=None):
                self.model.save("final.keras")

        class Reader(tf.keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                with open("config.json") as f:
                    self.config = json.load(f)

        class Printer(tf.keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                print(epoch)

        class NotACallback:
            def save(self):
                open("x", "w")
    """})
    project = Project(files)
    path = tmp_path / "callbacks.py"
    found = {n for n in ("Logger", "Saver", "Reader", "Printer", "NotACallback", "Missing")
             if project.writing_callback(path, n)}
    assert found == {"Logger", "Saver"}


def test_subclasses_of_keras_writing_callbacks_write_files(tmp_path: Path):
    # keras-yolo3: CustomModelCheckpoint(ModelCheckpoint) and CustomTensorBoard(TensorBoard),
    # built in train.py's create_callbacks() and handed to fit, wrote on every rank.
    files = tree(tmp_path, {"callbacks.py": """
        from keras.callbacks import ModelCheckpoint, TensorBoard
        import tensorflow as tf

        class CustomTensorBoard(TensorBoard):
            def on_batch_end(self, batch, logs=None):
                super().on_batch_end(batch, logs)

        class CustomModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
            def on_epoch_end(self, epoch, logs=None):
                super().on_epoch_end(epoch, logs)

        class Stopper(tf.keras.callbacks.EarlyStopping):
            pass
    """})
    project = Project(files)
    path = tmp_path / "callbacks.py"
    found = {n for n in ("CustomTensorBoard", "CustomModelCheckpoint", "Stopper")
             if project.writing_callback(path, n)}
    assert found == {"CustomTensorBoard", "CustomModelCheckpoint"}


def test_a_learning_rate_from_a_config_module_is_scaled_once_where_the_optimizer_is_built(
    tmp_path: Path,
):
    main = MAIN.replace("import data\n", "import config\nimport data\n").replace(
        "lr=0.1", "lr=config.LR"
    )
    tree(tmp_path, {"data.py": DATA, "main.py": main, "config.py": "LR = 0.1\nBATCH = 16\n"})
    files = [(tmp_path / n, n) for n in ("config.py", "data.py", "main.py")]
    chosen = project_options(files, Options())
    converted = {
        name: convert((tmp_path / name).read_bytes(), chosen[(tmp_path / name).resolve()])
        for name in ("config.py", "main.py")
    }
    assert not converted["config.py"].changed
    assert converted["main.py"].output.decode().count("sdp.size()") == 1
    assert "lr=config.LR * sdp.size()" in converted["main.py"].output.decode()


CHAIN_TRAINER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        self.loader = DataLoader(data, batch_size=8, shuffle=True)

    def fit(self, epochs):
        for _ in range(epochs):
            for x, y in self.loader:
                self.optimizer.zero_grad()
                torch.nn.functional.mse_loss(self.model(x), y).backward()
                self.optimizer.step()
"""

CHAIN_RUNNER = """\
import torch

from trainer import Trainer


def run(epochs):
    Trainer(torch.nn.Linear(4, 1), 0.1).fit(epochs)
"""

CHAIN_MAIN = """\
import torch

from runner import run

if __name__ == "__main__":
    run(2)
"""


def test_an_entry_point_initialises_for_training_code_it_reaches_through_another_module(
    tmp_path: Path,
):
    """main -> runner -> trainer: main runs trainer's training code through runner, so main gets
    init(), and trainer gets no 'nothing runs this module' note."""
    tree(tmp_path, {"trainer.py": CHAIN_TRAINER, "runner.py": CHAIN_RUNNER, "main.py": CHAIN_MAIN})
    files = [(tmp_path / name, name) for name in ("main.py", "runner.py", "trainer.py")]
    chosen = project_options(files, Options())
    main = chosen[(tmp_path / "main.py").resolve()]
    trainer = chosen[(tmp_path / "trainer.py").resolve()]
    assert main.project is not None and main.project.starts == ("trainer.py",)
    assert trainer.project is not None and trainer.project.started_by == ("main.py",)
    assert "sdp.init()" in convert(CHAIN_MAIN, main).output.decode()
    converted = convert(CHAIN_TRAINER, trainer)
    assert "DistributedSampler" in converted.output.decode()
    assert not [c for c in converted.changes if c.transform == "add_runtime_init"]


def test_classes_that_open_a_file_to_write_in_init_are_handles(tmp_path: Path):
    files = tree(tmp_path, {"logs.py": """
        import logging
        import tensorflow as tf

        class JSONLines:
            def __init__(self, path):
                self.fh = open(path, "a")

        class LogFile:
            def __init__(self, path):
                self.handler = logging.FileHandler(path)

        class Reader:
            def __init__(self, path):
                self.fh = open(path)

        class LateWriter:
            def save(self, path):
                open(path, "w").write("x")

        class WritesOnce:
            def __init__(self, path):
                with open(path, "a") as log:
                    log.write("opened\\n")
                self.path = path

        class Logger(tf.keras.callbacks.Callback):
            def __init__(self, path):
                self.fh = open(path, "w")
    """})
    project = Project(files)
    path = tmp_path / "logs.py"
    found = {n for n in ("JSONLines", "LogFile", "Reader", "LateWriter", "WritesOnce", "Logger",
                      "Missing")
             if project.writing_class(path, n)}
    assert found == {"JSONLines", "LogFile"}  # a Keras callback is wrap_keras_fit's


def test_a_star_imported_module_is_imported_and_a_helper_of_the_training_script(tmp_path: Path):
    tree(tmp_path, {
        "curves.py": "import os\n\ndef save_curve(d):\n    if not os.path.isdir(d):\n"
                     "        os.mkdir(d)\n",
        "train.py": MAIN.replace("import data\n", "import data\nfrom curves import *\n"),
        "data.py": DATA,
    })
    files = [(tmp_path / n, n) for n in ("curves.py", "train.py", "data.py")]
    project = Project({p: p.read_bytes() for p, _ in files})
    assert tmp_path / "curves.py" in imported_modules(project, tmp_path / "train.py")
    chosen = project_options(files, Options())
    facts = chosen[(tmp_path / "curves.py").resolve()].project
    assert facts is not None and facts.helper and facts.framework == "torch"
    out = convert((tmp_path / "curves.py").read_bytes(), chosen[(tmp_path / "curves.py")
                                                              .resolve()]).output.decode()
    assert "        os.makedirs(d, exist_ok=True)\n" in out
    assert "sdp" not in out  # nothing else: no import, no init
