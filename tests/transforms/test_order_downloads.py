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


def test_a_download_to_a_path_runs_on_rank_0_with_its_existence_test_then_a_barrier():
    """``rank0_first`` would make the other ranks download again after rank 0, rewriting the
    file rank 0 already reads; ``if not os.path.exists`` inside it deadlocked."""
    result = check_transformed(
        """\
        import os
        import urllib.request
        import zipfile
        import torch

        def fetch(root):
            if not os.path.exists(root + "/a.zip"):
                urllib.request.urlretrieve("https://x.org/a.zip", root + "/a.zip")
            with zipfile.ZipFile(root + "/a.zip") as z:
                z.extractall(root)
            print("ready")
        """ + TAIL.replace("\n", "\n        "),
        """\
        import os
        import urllib.request
        import zipfile
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()

        def fetch(root):
            if sdp.rank() == 0:
                if not os.path.exists(root + "/a.zip"):
                    urllib.request.urlretrieve("https://x.org/a.zip", root + "/a.zip")
                with zipfile.ZipFile(root + "/a.zip") as z:
                    z.extractall(root)
            sdp.barrier()
            print("ready")
        """ + TAIL.replace("\n", "\n        "),
        only=ONLY,
    )
    assert [m.split(" on ")[0] for m in messages(result, ONLY)] == [
        "urllib.request.urlretrieve(...) downloads", "z.extractall(...) unpacks"]


def test_a_network_read_goes_to_rank_0_with_the_write_of_its_content_only():
    result = run(
        """\
        import requests
        import torch

        def fetch(path):
            r = requests.get("https://x.org/data.csv")
            with open(path, "wb") as f:
                f.write(r.content)
            info = requests.get("https://x.org/info.json").json()
            return info
        """ + TAIL.replace("\n", "\n        "),
        ONLY,
    )
    out = result.output.decode()
    assert ("    if sdp.rank() == 0:\n        r = requests.get(\"https://x.org/data.csv\")\n"
            "        with open(path, \"wb\") as f:\n            f.write(r.content)\n"
            "    sdp.barrier()\n    info = requests.get") in out
    written, read = messages(result, ONLY)
    assert written.startswith("requests.get(...) writes what it downloads on rank 0 only, then")
    assert read.startswith("requests.get(...) reads over the network on every rank")
    assert not messages(result, ONLY, manual=True)


def test_a_download_whose_result_is_used_or_that_is_in_a_loop_gets_a_manual_note():
    result = run(
        """\
        import gdown
        import numpy as np
        import shutil
        import torch

        URL = "https://x.org/means.txt"

        def fetch(urls):
            path = gdown.download("https://drive.google.com/uc?id=1", "w.npy")
            for u in urls:
                shutil.unpack_archive(u, "extra")
            return np.load(path), np.loadtxt(URL)
        """ + TAIL.replace("\n", "\n        "),
        ONLY,
    )
    notes = messages(result, ONLY, manual=True)
    assert len(notes) == 3, notes
    assert "it assigns a name used later" in notes[0]
    assert "may not all get to a barrier" in notes[1]
    assert notes[2].startswith("np.loadtxt(URL) downloads into ./<host>/<path>")
    assert "sdp.barrier()" not in result.output.decode().replace("# sdp-convert", "")


def test_a_network_read_and_its_write_under_an_existence_test_go_to_rank_0_with_the_test():
    result = run(
        """\
        import os
        import requests
        import torch

        def fetch(path):
            if not os.path.isfile(path):
                r = requests.get("https://x.org/data.csv")
                with open(path, "wb") as f:
                    f.write(r.content)
            return path
        """ + TAIL.replace("\n", "\n        "),
        ONLY,
    )
    assert ("    if sdp.rank() == 0:\n        if not os.path.isfile(path):\n"
            "            r = requests.get(\"https://x.org/data.csv\")\n") in result.output.decode()
    assert "    sdp.barrier()\n    return path\n" in result.output.decode()


def test_torchvisions_download_url_runs_on_local_rank_0_first_before_the_extraction():
    """deeplabv3plus's datasets/voc.py: ``download_url`` skips a file whose checksum matches,
    but on a first run every rank found none and wrote the same tar while rank 0 extracted it.
    In a training script it runs on each machine's rank 0 first (the others then find it
    whole); a data module's conversion runs it with the extraction on rank 0
    (``test_note_truth``, the fetch repair)."""
    result = check_transformed(
        """\
        import os
        import tarfile
        import torch
        from torchvision.datasets.utils import download_url

        def download_extract(url, root, filename, md5):
            download_url(url, root, filename, md5)
            with tarfile.open(os.path.join(root, filename), "r") as tar:
                tar.extractall(path=root)
        """ + TAIL.replace("\n", "\n        "),
        """\
        import os
        import tarfile
        import torch
        from torchvision.datasets.utils import download_url
        import sdp_runtime.torch as sdp

        sdp.init()

        def download_extract(url, root, filename, md5):
            with sdp.rank0_first():
                download_url(url, root, filename, md5)
            if sdp.rank() == 0:
                with tarfile.open(os.path.join(root, filename), "r") as tar:
                    tar.extractall(path=root)
            sdp.barrier()
        """ + TAIL.replace("\n", "\n        "),
        only=ONLY,
    )
    assert [m.split(" on ")[0] for m in messages(result, ONLY)] == [
        "download_url(...) downloads", "tar.extractall(...) unpacks"]


def test_word_vectors_download_on_local_rank_0_first():
    """sentiment-rnn notebook: ``torchtext.vocab.GloVe()`` downloads and unpacks about 2 GB into
    .vector_cache when it is made: every rank did it at once on a first run."""
    result = check_transformed(
        """\
        import torch
        import torchtext

        vectors = torchtext.vocab.GloVe()
        """ + TAIL.replace("\n", "\n        "),
        """\
        import torch
        import torchtext
        import sdp_runtime.torch as sdp

        sdp.init()

        with sdp.rank0_first():
            vectors = torchtext.vocab.GloVe()
        """ + TAIL.replace("\n", "\n        "),
        only=ONLY,
    )
    assert [m.split(" on ")[0] for m in messages(result, ONLY)] == [
        "torchtext.vocab.GloVe(...) downloads"]


def test_torchtext_local_file_readers_are_left_and_its_downloads_ordered():
    """A legacy torchtext constructor given local files (``path=``, ``fields=``) only reads them;
    its ``splits`` classmethod without ``path=`` downloads, as do torchtext 0.12's functions."""
    result = check_transformed(
        """\
        import torch
        from torchtext.datasets import TranslationDataset, Multi30k, AG_NEWS

        corpus = TranslationDataset(path="bpe/train", exts=(".src", ".trg"), fields=(src, trg))
        local = Multi30k.splits(exts=(".de", ".en"), fields=(src, trg), path="corpus/")
        pairs = Multi30k.splits(exts=(".de", ".en"), fields=(src, trg))
        news = AG_NEWS(root="cache", split="train")
        """ + TAIL.replace("\n", "\n        "),
        """\
        import torch
        from torchtext.datasets import TranslationDataset, Multi30k, AG_NEWS
        import sdp_runtime.torch as sdp

        sdp.init()

        corpus = TranslationDataset(path="bpe/train", exts=(".src", ".trg"), fields=(src, trg))
        local = Multi30k.splits(exts=(".de", ".en"), fields=(src, trg), path="corpus/")
        with sdp.rank0_first():
            pairs = Multi30k.splits(exts=(".de", ".en"), fields=(src, trg))
            news = AG_NEWS(root="cache", split="train")
        """ + TAIL.replace("\n", "\n        "),
        only=ONLY,
    )
    assert [m.split(" on ")[0] for m in messages(result, ONLY)] == [
        "Multi30k.splits(...) downloads", "AG_NEWS(...) downloads"]
