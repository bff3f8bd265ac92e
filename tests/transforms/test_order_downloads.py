from __future__ import annotations

from .helpers import check_noop, check_transformed, messages, run

ONLY = "order_downloads"
TAIL = """\
for x, y in loader:
    model(x).sum().backward()
    opt.step()
"""


def test_torchvision_downloads_run_on_local_rank_0_first_and_others_are_left():
    result = check_transformed(
        """\
        import torch
        from torchvision import datasets

        train = datasets.MNIST("data", train=True, download=True)
        test = datasets.MNIST("data", train=False)
        folder = datasets.ImageFolder("images")
        loader = torch.utils.data.DataLoader(train)
        """ + TAIL.replace("\n", "\n        "),
        """\
        import torch
        from torchvision import datasets
        import sdp_runtime.torch as sdp

        sdp.init()

        with sdp.rank0_first():
            train = datasets.MNIST("data", train=True, download=True)
        test = datasets.MNIST("data", train=False)
        folder = datasets.ImageFolder("images")
        loader = torch.utils.data.DataLoader(train)
        """ + TAIL.replace("\n", "\n        "),
        only=ONLY,
    )
    assert messages(result, ONLY) == [
        "datasets.MNIST(...) downloads on each machine's local rank 0 first, then on the other "
        "ranks, which find its files (with sdp.rank0_first())"
    ]


def test_consecutive_downloads_share_one_block_and_a_converted_file_is_left_alone():
    source = """\
        import tensorflow as tf
        import tensorflow_datasets as tfds

        def main():
            path = tf.keras.utils.get_file("data.npz", "https://example.com/data.npz")
            ds = tfds.load("mnist", split="train")
            model.compile(optimizer="sgd", loss="mse")
            model.fit(ds)
        """
    result = run(source, ONLY)
    assert (
        "    with sdp.rank0_first():\n"
        '        path = tf.keras.utils.get_file("data.npz", "https://example.com/data.npz")\n'
        '        ds = tfds.load("mnist", split="train")\n'
    ) in result.output.decode()
    check_noop(result.output.decode(), only=ONLY)


def test_a_download_that_is_not_a_statement_of_its_own_is_reported():
    result = run(
        "import torch\nfrom torchvision import datasets\n\n"
        "loader = torch.utils.data.DataLoader(datasets.MNIST('d', download=True)) if ok else None\n"
        + TAIL,
        ONLY,
    )
    assert [m for m in messages(result, ONLY, manual=True) if "rank0_first" in m]
    assert "with sdp.rank0_first():" not in result.output.decode()
