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


def test_pretrained_weights_hub_models_and_an_aliased_dataset_module_are_ordered():
    result = run(
        """\
        import tensorflow as tf
        from tensorflow import keras
        from transformers import AutoModel

        def main():
            mnist = tf.keras.datasets.mnist
            (x, y), _ = mnist.load_data()
            base = keras.applications.MobileNetV2(include_top=False)
            scratch = keras.applications.ResNet50(weights=None)
            bert = AutoModel.from_pretrained("bert-base-uncased")
            model.compile(optimizer="sgd", loss="mse")
            model.fit(x, y)
        """,
        ONLY,
    )
    out = result.output.decode()
    assert ("    with sdp.rank0_first():\n        (x, y), _ = mnist.load_data()\n"
            "        base = keras.applications.MobileNetV2(include_top=False)\n") in out
    assert "    scratch = keras.applications.ResNet50(weights=None)\n" in out
    assert ('    with sdp.rank0_first():\n        bert = AutoModel.from_pretrained('
            '"bert-base-uncased")\n') in out
    assert len(messages(result, ONLY)) == 3


def test_torchvision_models_with_weights_are_ordered_and_untrained_ones_left():
    result = run(
        """\
        import torch
        import torchvision

        def main():
            net = torchvision.models.resnet18(weights="IMAGENET1K_V1")
            old = torchvision.models.vgg11(pretrained=True)
            fresh = torchvision.models.resnet18(weights=None)
            for x, y in loader:
                net(x).sum().backward()
                opt.step()
        """,
        ONLY,
    )
    assert [m.split("(")[0] for m in messages(result, ONLY)] == [
        "torchvision.models.resnet18", "torchvision.models.vgg11"]
    assert "    fresh = torchvision.models.resnet18(weights=None)\n" in result.output.decode()
