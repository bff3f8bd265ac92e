"""shard_shared_loader: a loader factory shared by training and evaluation gets a flag that only
the training calls set, adding a DistributedSampler; the evaluation loaders stay whole."""

from __future__ import annotations

from .helpers import messages, run
from .test_shard_dataloader import SHARED_HELPER

ONLY = "shard_shared_loader"


def test_a_helper_shared_with_evaluation_splits_only_the_training_loader():
    """sentiment-rnn notebook: get_data_loader() builds the train, validation and test loaders.
    The training call sets the new flag; the others are built as before; set_epoch goes in the
    epoch loop on the caller's loader, and the rate is scaled (the training data is split)."""
    out = run(SHARED_HELPER).output.decode()
    assert "def get_data_loader(dataset, batch_size, shuffle=False, shard=False):\n" in out
    assert (
        "    data_sampler = (\n"
        "        torch.utils.data.distributed.DistributedSampler(\n"
        "            dataset, num_replicas=sdp.size(), rank=sdp.rank(), shuffle=shuffle\n"
        "        )\n"
        "        if shard\n"
        "        else None\n"
        "    )\n") in out
    assert "shuffle=False if shard else shuffle, sampler=data_sampler)" in out
    assert "train_data_loader = get_data_loader(train_data, 8, shuffle=True, shard=True)\n" in out
    assert "valid_data_loader = get_data_loader(valid_data, 8)\n" in out
    assert ("for epoch in range(3):\n    train_data_loader.sampler.set_epoch(epoch)\n"
            "    train(train_data_loader, model, optimizer)\n") in out
    assert "lr=0.1 * sdp.size())" in out
    result = run(SHARED_HELPER)
    assert not messages(result, manual=True)
    [give, epoch] = messages(result, ONLY)
    assert give.startswith("give the DataLoader get_data_loader() builds a DistributedSampler "
                           "(data_sampler, shuffle=shuffle) when its new shard= flag is set")
    assert "the loaders for evaluation (valid_data_loader) stay whole" in give
    assert epoch == "call train_data_loader.sampler.set_epoch(epoch) at the start of each epoch"


def test_the_converted_helper_gives_each_rank_its_part_and_evaluates_everything():
    """The converted code run as two ranks (the sampler's rank/size given by hand): the training
    loaders of the two ranks hold disjoint halves of the data; each validation loader all of
    it, in order, as on one process."""
    import torch

    out = run(SHARED_HELPER).output.decode()
    factory = out[out.index("def get_data_loader"):out.index("def train(")]
    data = torch.utils.data.TensorDataset(torch.arange(16.0))

    def loaders(rank: int) -> tuple[list[float], list[float]]:
        sdp = type("sdp", (), {"size": staticmethod(lambda: 2),
                               "rank": staticmethod(lambda: rank)})
        scope: dict = {"torch": torch, "sdp": sdp}
        exec(factory, scope)
        train = scope["get_data_loader"](data, 4, shuffle=True, shard=True)
        valid = scope["get_data_loader"](data, 4)
        return ([float(v) for (b,) in train for v in b], [float(v) for (b,) in valid for v in b])

    (train0, valid0), (train1, valid1) = loaders(0), loaders(1)
    assert len(train0) == len(train1) == 8 and not set(train0) & set(train1)
    assert valid0 == valid1 == [float(i) for i in range(16)]


SHARED_SAMPLER_HELPER = """\
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


def make_loader(x, y, batch_size):
    data = TensorDataset(x, y)
    sampler = RandomSampler(data)
    loader = DataLoader(data, sampler=sampler, batch_size=batch_size)
    return loader


def fit(epoch):
    for xb, yb in fit_loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(xb), yb).backward()
        opt.step()


def score(epoch):
    with torch.no_grad():
        print(sum(float(net(xb).sum()) for xb, _ in score_loader))


if __name__ == "__main__":
    fit_loader = make_loader(torch.randn(32, 4), torch.randn(32, 1), 8)
    score_loader = make_loader(torch.randn(16, 4), torch.randn(16, 1), 8)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-5)

for epoch in range(2):
    fit(epoch)
    score(epoch)
"""


def test_a_shared_helper_with_its_own_random_sampler_keeps_it_for_evaluation():
    """kisti-bert-nsmc: create_dataloader() gives every loader `sampler=RandomSampler(data)`
    (through a name), for training and for the test. The training call's loader gets a
    DistributedSampler (shuffle=True), the test's keeps its RandomSampler; the AdamW rate is
    scaled. The epoch loop runs at module level, where the training loader is bound only under
    `if __name__ == "__main__":`: set_epoch there could read an unbound name, so it is a note."""
    result = run(SHARED_SAMPLER_HELPER)
    out = result.output.decode()
    assert "def make_loader(x, y, batch_size, shard=False):\n" in out
    assert ("            data, num_replicas=sdp.size(), rank=sdp.rank(), shuffle=True\n"
            "        )\n        if shard\n        else sampler\n    )\n") in out
    assert "loader = DataLoader(data, sampler=loader_sampler, batch_size=batch_size)\n" in out
    assert "fit_loader = make_loader(torch.randn(32, 4), torch.randn(32, 1), 8, shard=True)" in out
    assert "score_loader = make_loader(torch.randn(16, 4), torch.randn(16, 1), 8)\n" in out
    assert "lr=2e-5 * sdp.size())" in out
    assert "set_epoch" not in out.replace("# sdp-convert: manual", "").split("# sdp-convert")[0]
    [note] = messages(result, manual=True)
    assert note.startswith("call fit_loader.sampler.set_epoch(epoch) at the start of every "
                           "epoch (the epoch loop can run where the loader is not bound")
    # With the epoch loop inside the block, set_epoch goes there.
    inside = SHARED_SAMPLER_HELPER.replace(
        "\nfor epoch in range(2):\n    fit(epoch)\n    score(epoch)\n",
        "    for epoch in range(2):\n        fit(epoch)\n        score(epoch)\n")
    result = run(inside)
    assert ("    for epoch in range(2):\n        fit_loader.sampler.set_epoch(epoch)\n"
            "        fit(epoch)\n") in result.output.decode()
    assert not messages(result, manual=True)


def test_set_epoch_in_a_module_level_loop_that_reads_a_name_bound_only_under_the_guard():
    """kisti-bert-nsmc: `args = parser.parse_args()` and the loaders are bound under
    `if __name__ == "__main__":`, and the epoch loop past it reads `range(args.epochs)`. Where
    the block has not run, that read raises before the first pass; where it ran, it ran whole,
    so the loader is bound in the loop: set_epoch goes there, no note. A name that is also a
    builtin, or read only under `or`, proves nothing: the note stays."""
    source = SHARED_SAMPLER_HELPER.replace(
        'if __name__ == "__main__":\n',
        'if __name__ == "__main__":\n    epochs = 2\n').replace("range(2)", "range(0, epochs)")
    result = run(source)
    assert ("for epoch in range(0, epochs):\n    fit_loader.sampler.set_epoch(epoch)\n"
            "    fit(epoch)\n") in result.output.decode()
    assert not messages(result, manual=True)
    # `2 or epochs` may not read `epochs`; `len`
    # bound under the guard is a builtin elsewhere: neither proves the block ran.
    for guard_binds, header in (("epochs = 2", "range(2 or epochs)"),
                                ("len = 2", "range(len([1, 2]))")):
        shape = source.replace("epochs = 2", guard_binds).replace("range(0, epochs)", header)
        result = run(shape)
        assert "    fit_loader.sampler.set_epoch(epoch)\n" not in result.output.decode()
        [note] = messages(result, manual=True)
        assert "the epoch loop can run where the loader is not bound" in note
