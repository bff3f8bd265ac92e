from __future__ import annotations

import textwrap

from .helpers import TF_ALREADY_CONVERTED, check_noop, check_transformed, messages, reported, run

ONLY = "pin_tf_gpus"
ALREADY_CONVERTED = TF_ALREADY_CONVERTED

# Something that makes the file a TensorFlow training script (Keras compile + fit).
FIT = """\
model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(dataset, epochs=1)
"""
PIN = """\
gpus = tf.config.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.set_visible_devices(gpus[sdp.local_rank()], "GPU")
"""


def pinned(result):
    return reported(result, ONLY, manual=False)


def notes(result):
    return reported(result, ONLY, manual=True)


def test_memory_growth_and_the_local_rank_gpu_right_after_init():
    result = check_transformed(
        "import os\n\nimport tensorflow as tf\n\nEPOCHS = 3\n" + FIT,
        "import os\n\nimport tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\n\n"
        "sdp.init()\n" + PIN + "\nEPOCHS = 3\n" + FIT,
        only=ONLY,
    )
    assert pinned(result) == [(3, "pin this worker to GPU gpus[sdp.local_rank()], with memory growth")]
    assert notes(result) == []


def test_every_tensorflow_import_spelling_is_used_or_completed():
    # ``import tensorflow`` without an alias: its own name is used.
    check_transformed(
        "import tensorflow\n\nmodel = tensorflow.keras.Sequential([])\n"
        'model.compile(optimizer="sgd", loss="mse")\nmodel.fit(dataset)\n',
        "import tensorflow\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n"
        + PIN.replace("tf.", "tensorflow.")
        + "\nmodel = tensorflow.keras.Sequential([])\n"
        'model.compile(optimizer="sgd", loss="mse")\nmodel.fit(dataset)\n',
        only=ONLY,
    )
    # Keras only (``from tensorflow import keras``, Keras 3's ``import keras``): tf is imported.
    for keras_import in ("from tensorflow import keras", "import keras"):
        check_transformed(
            f"{keras_import}\n\nmodel = keras.Sequential([])\n"
            'model.compile(optimizer="sgd", loss="mse")\nmodel.fit(dataset)\n',
            f"{keras_import}\nimport tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\n\n"
            "sdp.init()\n" + PIN + "\nmodel = keras.Sequential([])\n"
            'model.compile(optimizer="sgd", loss="mse")\nmodel.fit(dataset)\n',
            only=ONLY,
        )


def test_names_the_script_uses_are_not_taken_over():
    script = "import tensorflow as tf\n\ngpus = 4\ngpu = 0\n\n" + FIT
    result = check_transformed(
        script,
        "import tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n"
        + 'sdp_gpus = tf.config.list_physical_devices("GPU")\n'
        "for sdp_gpu in sdp_gpus:\n"
        "    tf.config.experimental.set_memory_growth(sdp_gpu, True)\n"
        "if sdp_gpus:\n"
        '    tf.config.set_visible_devices(sdp_gpus[sdp.local_rank()], "GPU")\n'
        + script.removeprefix("import tensorflow as tf\n"),
        only=ONLY,
    )
    assert pinned(result) == [
        (1, "pin this worker to GPU sdp_gpus[sdp.local_rank()], with memory growth")
    ]


def test_a_script_that_sets_memory_growth_itself_gets_only_the_pinning():
    # Its own loop stays, on its own list of GPUs; no second memory-growth block.
    for list_devices in ("list_physical_devices", "experimental.list_physical_devices"):
        script = (
            "import tensorflow as tf\n\n"
            f'gpus = tf.config.{list_devices}("GPU")\n'
            "for gpu in gpus:\n"
            "    tf.config.experimental.set_memory_growth(gpu, True)\n\n" + FIT
        )
        result = check_transformed(
            script,
            "import tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n\n"
            f'gpus = tf.config.{list_devices}("GPU")\n'
            "for gpu in gpus:\n"
            "    tf.config.experimental.set_memory_growth(gpu, True)\n"
            "if gpus:\n"
            '    tf.config.set_visible_devices(gpus[sdp.local_rank()], "GPU")\n\n' + FIT,
            only=ONLY,
        )
        assert pinned(result) == [
            (4, "pin this worker to GPU gpus[sdp.local_rank()] after the script's own memory-growth loop")
        ]
        assert notes(result) == []
        check_noop(result.output.decode(), only=ONLY)


def test_the_memory_growth_loop_of_the_tensorflow_guide_gets_the_pinning_inside_it():
    # https://www.tensorflow.org/guide/gpu#limiting_gpu_memory_growth: within ``if gpus:`` and
    # its ``try`` (set_visible_devices raises the same RuntimeError once the GPUs are in use).
    result = check_transformed(
        textwrap.dedent("""\
        import tensorflow as tf

        gpus = tf.config.list_physical_devices('GPU')
        if gpus:
            try:
                for gpu in gpus:
                    tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError as e:
                print(e)

        """)
        + FIT,
        textwrap.dedent("""\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        gpus = tf.config.list_physical_devices('GPU')
        if gpus:
            try:
                for gpu in gpus:
                    tf.config.experimental.set_memory_growth(gpu, True)
                tf.config.set_visible_devices(gpus[sdp.local_rank()], "GPU")
            except RuntimeError as e:
                print(e)

        """)
        + FIT,
        only=ONLY,
    )
    assert pinned(result) == [
        (6, "pin this worker to GPU gpus[sdp.local_rank()] after the script's own memory-growth loop")
    ]
    check_noop(result.output.decode(), only=ONLY)


def test_a_memory_growth_loop_over_the_listing_itself_gets_a_list_for_the_pinning():
    check_transformed(
        textwrap.dedent("""\
        import tensorflow as tf
        from tensorflow import config

        gpus = ["not", "tensorflow's"]
        for device in config.experimental.list_physical_devices("GPU"):
            config.experimental.set_memory_growth(device, True)

        """)
        + FIT,
        textwrap.dedent("""\
        import tensorflow as tf
        from tensorflow import config
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        gpus = ["not", "tensorflow's"]
        for device in config.experimental.list_physical_devices("GPU"):
            config.experimental.set_memory_growth(device, True)
        sdp_gpus = config.experimental.list_physical_devices("GPU")
        if sdp_gpus:
            config.set_visible_devices(sdp_gpus[sdp.local_rank()], "GPU")

        """)
        + FIT,
        only=ONLY,
    )


def test_tensorflow_imported_in_main_is_pinned_there_not_imported_at_the_top():
    # The pinning must run before the first TF op: right after main()'s own import.
    result = check_transformed(
        """\
        import argparse


        def main():
            import tensorflow as tf

            args = parse()
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            model.fit(dataset, epochs=1)


        if __name__ == "__main__":
            main()
        """,
        """\
        import argparse
        import sdp_runtime.tensorflow as sdp

        sdp.init()


        def main():
            import tensorflow as tf
            gpus = tf.config.list_physical_devices("GPU")
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
            if gpus:
                tf.config.set_visible_devices(gpus[sdp.local_rank()], "GPU")

            args = parse()
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            model.fit(dataset, epochs=1)


        if __name__ == "__main__":
            main()
        """,
        only=ONLY,
    )
    assert pinned(result) == [
        (5, "pin this worker to GPU gpus[sdp.local_rank()], with memory growth, right after "
            "TensorFlow is imported in main()")
    ]
    check_noop(result.output.decode(), only=ONLY)


def test_tensorflow_imported_in_several_functions_is_pinned_in_the_one_that_trains():
    # Keras only there: TensorFlow is imported next to it, in the function.
    result = check_transformed(
        """\
        import os


        def evaluate(model):
            import tensorflow as tf
            return model.evaluate(tf.zeros((1, 1)))


        def train(gpus):
            from tensorflow import keras

            model = keras.Sequential([keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            model.fit(dataset, epochs=1)

        if __name__ == "__main__":
            main()
        """,
        """\
        import os
        import sdp_runtime.tensorflow as sdp

        sdp.init()


        def evaluate(model):
            import tensorflow as tf
            return model.evaluate(tf.zeros((1, 1)))


        def train(gpus):
            from tensorflow import keras
            import tensorflow as tf
            sdp_gpus = tf.config.list_physical_devices("GPU")
            for gpu in sdp_gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
            if sdp_gpus:
                tf.config.set_visible_devices(sdp_gpus[sdp.local_rank()], "GPU")

            model = keras.Sequential([keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            model.fit(dataset, epochs=1)

        if __name__ == "__main__":
            main()
        """,
        only=ONLY,
    )
    assert [line for line, _ in pinned(result)] == [10]
    check_noop(result.output.decode(), only=ONLY)


def test_tensorflow_imported_in_a_try_or_after_the_script_own_init():
    # After the ``try`` (the pinning would not see ``tf`` before it).
    check_transformed(
        textwrap.dedent("""\
        import numpy as np

        try:
            import tensorflow as tf
        except ImportError:
            raise SystemExit("needs tensorflow")

        """)
        + FIT,
        textwrap.dedent("""\
        import numpy as np
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        try:
            import tensorflow as tf
        except ImportError:
            raise SystemExit("needs tensorflow")
        """)
        + PIN
        + "\n"
        + FIT,
        only=ONLY,
    )
    # In main() with the script's own init after the import: after the init.
    check_transformed(
        """\
        import sdp_runtime.tensorflow as sdp


        def main():
            import tensorflow as tf
            sdp.init()
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            model.fit(dataset, epochs=1)
        """,
        """\
        import sdp_runtime.tensorflow as sdp


        def main():
            import tensorflow as tf
            sdp.init()
            gpus = tf.config.list_physical_devices("GPU")
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
            if gpus:
                tf.config.set_visible_devices(gpus[sdp.local_rank()], "GPU")
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            model.fit(dataset, epochs=1)
        """,
        only=ONLY,
    )


def test_pinning_follows_an_init_the_script_makes_itself():
    check_transformed(
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp


        def main():
            sdp.init()
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            model.fit(dataset, epochs=1)
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp


        def main():
            sdp.init()
            gpus = tf.config.list_physical_devices("GPU")
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
            if gpus:
                tf.config.set_visible_devices(gpus[sdp.local_rank()], "GPU")
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            model.fit(dataset, epochs=1)
        """,
        only=ONLY,
    )


def test_a_script_that_picks_its_visible_gpu_gets_the_local_rank_instead():
    result = check_transformed(
        textwrap.dedent("""\
        import tensorflow as tf
        from tensorflow import config as tfc

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            try:
                tf.config.set_visible_devices(gpus[0], "GPU")
            except RuntimeError as e:
                print(e)
        tfc.experimental.set_visible_devices([gpus[1]], "GPU")
        """)
        + FIT,
        textwrap.dedent("""\
        import tensorflow as tf
        from tensorflow import config as tfc
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            try:
                tf.config.set_visible_devices(gpus[sdp.local_rank()], "GPU")
            except RuntimeError as e:
                print(e)
        tfc.experimental.set_visible_devices([gpus[sdp.local_rank()]], "GPU")
        """)
        + FIT,
        only=ONLY,
    )
    # Reported, and no second pinning block.
    assert pinned(result) == [
        (7, "visible GPU index 0 -> sdp.local_rank(): each worker uses its own GPU"),
        (10, "visible GPU index 1 -> sdp.local_rank(): each worker uses its own GPU"),
    ]


def test_a_device_choice_the_converter_cannot_read_needs_a_person():
    result = check_transformed(
        'import tensorflow as tf\n\ntf.config.set_visible_devices(gpus[args.gpu], "GPU")\n' + FIT,
        "import tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n\n"
        'tf.config.set_visible_devices(gpus[args.gpu], "GPU")\n' + FIT,
        only=ONLY,
    )
    assert notes(result) == [
        (3, "the script chooses its visible devices: make each worker use only GPU sdp.local_rank()")
    ]
    assert pinned(result) == []


def test_a_script_that_hides_every_gpu_stays_on_the_cpu():
    result = check_transformed(
        'import tensorflow as tf\n\ntf.config.set_visible_devices([], "GPU")\n' + FIT,
        "import tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n\n"
        'tf.config.set_visible_devices([], "GPU")\n' + FIT,
        only=ONLY,
    )
    assert messages(result, ONLY) == []


def test_cuda_visible_devices_set_by_the_script_needs_a_person():
    result = check_transformed(
        'import os\nimport tensorflow as tf\n\nos.environ["CUDA_VISIBLE_DEVICES"] = "0"\n'
        'os.environ.setdefault("CUDA_VISIBLE_DEVICES", "1")\n' + FIT,
        'import os\nimport tensorflow as tf\n\nos.environ["CUDA_VISIBLE_DEVICES"] = "0"\n'
        'os.environ.setdefault("CUDA_VISIBLE_DEVICES", "1")\n\n'
        "import sdp_runtime.tensorflow as sdp\n\nsdp.init()\n" + PIN + FIT,
        only=ONLY,
    )
    note = (
        "CUDA_VISIBLE_DEVICES set by the script: every worker would use the same GPU; remove it "
        "(each worker is pinned to GPU sdp.local_rank())"
    )
    assert notes(result) == [(4, note), (5, note)]
    # Other environment variables are none of its business.
    result = run('import os\nimport tensorflow as tf\n\nos.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"\n' + FIT, ONLY)
    assert notes(result) == []


def test_one_constant_cuda_visible_devices_nothing_else_reads_is_removed():
    # Every worker would see GPU 0 only, and a worker past the first no GPU of its own at
    # gpus[sdp.local_rank()]: the one constant choice goes, and the report says so.
    result = check_transformed(
        'import os\nimport tensorflow as tf\n\nos.environ["CUDA_VISIBLE_DEVICES"] = "0"\n' + FIT,
        "import os\nimport tensorflow as tf\n\n"
        "import sdp_runtime.tensorflow as sdp\n\nsdp.init()\n" + PIN + "\n" + FIT,
        only=ONLY,
    )
    assert notes(result) == []
    assert messages(result, ONLY)[1] == (
        'removed CUDA_VISIBLE_DEVICES = "0": every worker would see only that GPU; each worker '
        "keeps GPU sdp.local_rank() instead (one process: GPU 0, as before)")
    # Read again later (or set from a variable): a person decides.
    source = ('import os\nimport tensorflow as tf\n\nos.environ["CUDA_VISIBLE_DEVICES"] = "0"\n'
              'print(os.environ["CUDA_VISIBLE_DEVICES"])\n' + FIT)
    assert [line for line, _ in notes(run(source, ONLY))] == [4]


def test_converting_the_output_again_changes_nothing():
    result = run("import tensorflow as tf\n" + FIT, ONLY)
    assert result.output.decode() == (
        "import tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n" + PIN + FIT
    )
    check_noop(result.output.decode(), only=ONLY)
    adapted = run('import tensorflow as tf\n\ntf.config.set_visible_devices(gpus[0], "GPU")\n' + FIT, ONLY)
    assert "gpus[sdp.local_rank()]" in adapted.output.decode()
    check_noop(adapted.output.decode(), only=ONLY)


def test_files_that_are_not_tensorflow_training_scripts_are_left_alone():
    # TensorFlow without training: nothing at all.
    check_noop(
        """\
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        model = tf.keras.models.load_model("model.keras")
        print(model.predict(x))
        """,
        only=ONLY,
    )
    # A PyTorch script: its GPU is pinned by pin_gpu_device, not with tf.config.
    result = run(
        """\
        import torch

        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).sum().backward()
        opt.step()
        """,
        ONLY,
    )
    assert messages(result, ONLY) == []
    assert "tf.config" not in result.output.decode()


def test_a_script_made_data_parallel_by_hand_is_left_alone():
    # fixtures/tensorflow/already_converted, looked at as if it were this converter's output.
    check_noop(ALREADY_CONVERTED.read_text(), only=ONLY)


def test_tensorflow_bound_only_below_the_pinning_is_imported_with_it():
    # yolov3-tf2: ``from tensorflow.python.client import device_lib`` then a print end the import
    # block; ``import tensorflow as tf`` comes later. The pinning runs before the script's first
    # TF op (``device_lib.list_local_devices()`` initialises the GPUs), so it imports TF itself.
    top = 'import os\nos.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"\n'
    top += "from tensorflow.python.client import device_lib\n"
    rest = "print(device_lib.list_local_devices())\nimport numpy as np\nimport tensorflow as tf\n\n"
    result = check_transformed(
        top + rest + FIT,
        top + "\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\nimport tensorflow as tf\n"
        + PIN + rest + FIT,
        only=ONLY,
    )
    assert pinned(result) == [(3, "pin this worker to GPU gpus[sdp.local_rank()], with memory growth")]
    check_noop(result.output.decode(), only=ONLY)
