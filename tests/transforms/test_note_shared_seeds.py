"""note_shared_seeds: a fixed seed makes every rank draw the same numbers in training."""

from __future__ import annotations

from .helpers import messages, run

ONLY = "note_shared_seeds"


def _notes(source: str) -> list[str]:
    return messages(run(source, ONLY), ONLY, manual=True)


def test_dcgan_noise_drawn_in_the_loop_after_a_fixed_seed():
    notes = _notes(
        """\
        import random

        import torch

        manualSeed = 999
        random.seed(manualSeed)
        torch.manual_seed(manualSeed)
        netG = torch.nn.Linear(4, 4)
        optimizerG = torch.optim.Adam(netG.parameters())
        for data in loader:
            noise = torch.randn(8, 4)
            optimizerG.zero_grad()
            netG(noise).mean().backward()
            optimizerG.step()
        """
    )
    assert notes == [
        "random.seed(manualSeed) is the same on every rank: right for the initial weights, but "
        "torch.randn(...) in the training loop then draws the same numbers on every rank; if "
        "they should differ, seed again after the model is built with seed + sdp.rank()"
    ]


def test_no_note_without_draws_in_training_or_with_a_rank_seed():
    assert _notes(
        """\
        import torch

        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        example = torch.randn(2, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        """
    ) == []
    assert _notes(
        """\
        import torch
        import sdp_runtime.torch as sdp

        sdp.init()
        torch.manual_seed(0 + sdp.rank())
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            model(x + torch.randn(2, 4)).sum().backward()
            optimizer.step()
        """
    ) == []


def test_tf_gan_noise_drawn_in_the_tape_loop_after_a_fixed_seed():
    # dragen-dcgan: tf.random.set_seed(22), then batch_z = tf.random.uniform(...) each step,
    # fed to both tapes: the generator's averaged gradient is one rank's noise.
    source = """\
        import tensorflow as tf

        def main():
            tf.random.set_seed(22)
            generator = tf.keras.Sequential([tf.keras.layers.Dense(4)])
            g_optimizer = tf.keras.optimizers.Adam(1e-3)
            for epoch in range(10):
                batch_z = tf.random.uniform(shape=[8, 4], minval=-1., maxval=1.)
                with tf.GradientTape() as tape:
                    g_loss = tf.reduce_mean(generator(batch_z))
                grads = tape.gradient(g_loss, generator.trainable_variables)
                g_optimizer.apply_gradients(zip(grads, generator.trainable_variables))

        if __name__ == "__main__":
            main()
        """
    assert _notes(source) == [
        "tf.random.set_seed(22) is the same on every rank: right for the initial weights, but "
        "tf.random.uniform(...) in the training loop then draws the same numbers on every rank;"
        " if they should differ, seed again after the model is built with seed + sdp.rank()"
    ]
    # Drawn in a step function the loop calls: the same.
    step = source.replace(
        """            for epoch in range(10):
                batch_z = tf.random.uniform(shape=[8, 4], minval=-1., maxval=1.)
                with tf.GradientTape() as tape:
                    g_loss = tf.reduce_mean(generator(batch_z))
                grads = tape.gradient(g_loss, generator.trainable_variables)
                g_optimizer.apply_gradients(zip(grads, generator.trainable_variables))
""",
        """            for epoch in range(10):
                step(generator, g_optimizer)

        def step(generator, g_optimizer):
            batch_z = tf.random.uniform(shape=[8, 4], minval=-1., maxval=1.)
            with tf.GradientTape() as tape:
                g_loss = tf.reduce_mean(generator(batch_z))
            grads = tape.gradient(g_loss, generator.trainable_variables)
            g_optimizer.apply_gradients(zip(grads, generator.trainable_variables))
""")
    assert "tf.random.uniform(...) in the training loop" in _notes(step)[0]
