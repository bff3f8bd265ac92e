from __future__ import annotations

from .helpers import TF_ALREADY_CONVERTED, check_noop, check_transformed, reported, run

ONLY = "broadcast_initial_state"
ALREADY_CONVERTED = TF_ALREADY_CONVERTED


def broadcasts(result):
    return reported(result, ONLY, manual=False)


def notes(result):
    return reported(result, ONLY, manual=True)


def test_eager_loop_broadcasts_model_and_optimizer_after_the_first_step():
    result = check_transformed(
        """\
        import tensorflow as tf

        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(0.1)

        # Train.
        for epoch in range(EPOCHS):
            for x, y in dataset:
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
            print(epoch, float(loss))
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(0.1)

        # Train.
        first_batch = True
        for epoch in range(EPOCHS):
            for x, y in dataset:
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                if first_batch:
                    sdp.broadcast_variables(model.variables, root_rank=0)
                    sdp.broadcast_variables(optimizer.variables, root_rank=0)
                    first_batch = False
            print(epoch, float(loss))
        """,
        only=ONLY,
    )
    assert broadcasts(result) == [
        (12, "after the first step, broadcast model.variables, optimizer.variables from rank 0")
    ]


def test_a_tf_function_step_is_left_alone_and_the_loop_calling_it_broadcasts():
    # The step function's parameters are translated to the call's arguments; Keras 3 spelling.
    check_transformed(
        """\
        import keras
        import tensorflow as tf

        model = keras.Sequential([keras.layers.Dense(1)])
        opt = keras.optimizers.Adam()


        @tf.function
        def train_step(net, optimizer, x, y):
            with tf.GradientTape() as tape:
                loss = keras.ops.mean((net(x) - y) ** 2)
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables))
            return loss


        def main():
            step = 0
            while step < 100:
                x, y = next(it)
                loss = train_step(model, opt, x, y)
                step += 1
        """,
        """\
        import keras
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        model = keras.Sequential([keras.layers.Dense(1)])
        opt = keras.optimizers.Adam()


        @tf.function
        def train_step(net, optimizer, x, y):
            with tf.GradientTape() as tape:
                loss = keras.ops.mean((net(x) - y) ** 2)
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables))
            return loss


        def main():
            step = 0
            first_batch = True
            while step < 100:
                x, y = next(it)
                loss = train_step(model, opt, x, y)
                if first_batch:
                    sdp.broadcast_variables(model.variables, root_rank=0)
                    sdp.broadcast_variables(opt.variables, root_rank=0)
                    first_batch = False
                step += 1
        """,
        only=ONLY,
    )


def test_every_model_and_optimizer_of_a_gan_step():
    result = run(
        """\
        import tensorflow as tf

        g_opt = tf.keras.optimizers.Adam(1e-4)
        d_opt = tf.keras.optimizers.Adam(1e-4)


        @tf.function
        def train_step(images):
            with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
                fake = generator(noise, training=True)
                g_loss = gen_loss(discriminator(fake, training=True))
                d_loss = disc_loss(discriminator(images, training=True), discriminator(fake, training=True))
            g_grads = gen_tape.gradient(g_loss, generator.trainable_variables)
            d_grads = disc_tape.gradient(d_loss, discriminator.trainable_variables)
            g_opt.apply_gradients(zip(g_grads, generator.trainable_variables))
            d_opt.apply_gradients(zip(d_grads, discriminator.trainable_variables))


        for epoch in range(EPOCHS):
            for batch in dataset:
                train_step(batch)
        """,
        ONLY,
    )
    assert result.output.decode().endswith(
        """\
first_batch = True
for epoch in range(EPOCHS):
    for batch in dataset:
        train_step(batch)
        if first_batch:
            sdp.broadcast_variables(generator.variables, root_rank=0)
            sdp.broadcast_variables(g_opt.variables, root_rank=0)
            sdp.broadcast_variables(discriminator.variables, root_rank=0)
            sdp.broadcast_variables(d_opt.variables, root_rank=0)
            first_batch = False
"""
    )


def test_a_method_step_and_variables_given_as_lists():
    check_transformed(
        """\
        import tensorflow as tf

        first_batch = "taken"


        class Trainer:
            def step(self, x, y):
                with tf.GradientTape() as tape:
                    loss = self.loss(y, self.model(x))
                grads = tape.gradient(loss, self.model.trainable_variables)
                self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))


        trainer = Trainer()
        for x, y in ds:
            trainer.step(x, y)
        for x, y in ds:  # linear head
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((x @ w + b - y) ** 2) + head(x)
            grads = tape.gradient(loss, [w, b] + head.trainable_weights)
            opt.apply_gradients(zip(grads, [w, b] + head.trainable_weights))
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        first_batch = "taken"


        class Trainer:
            def step(self, x, y):
                with tf.GradientTape() as tape:
                    loss = self.loss(y, self.model(x))
                grads = tape.gradient(loss, self.model.trainable_variables)
                self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))


        trainer = Trainer()
        sdp_first_batch = True
        for x, y in ds:
            trainer.step(x, y)
            if sdp_first_batch:
                sdp.broadcast_variables(trainer.model.variables, root_rank=0)
                sdp.broadcast_variables(trainer.optimizer.variables, root_rank=0)
                sdp_first_batch = False
        sdp_first_batch = True
        for x, y in ds:  # linear head
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((x @ w + b - y) ** 2) + head(x)
            grads = tape.gradient(loss, [w, b] + head.trainable_weights)
            opt.apply_gradients(zip(grads, [w, b] + head.trainable_weights))
            if sdp_first_batch:
                sdp.broadcast_variables([w, b], root_rank=0)
                sdp.broadcast_variables(head.variables, root_rank=0)
                sdp.broadcast_variables(opt.variables, root_rank=0)
                sdp_first_batch = False
        """,
        only=ONLY,
    )


def test_what_it_cannot_place_needs_a_person():
    source = """\
        import tensorflow as tf

        opt = tf.keras.optimizers.SGD(0.1)


        def step(x, y):
            m = build()
            with tf.GradientTape() as tape:
                loss = m(x)
            grads = tape.gradient(loss, m.trainable_variables)
            opt.apply_gradients(zip(grads, m.trainable_variables))


        for x, y in ds:
            step(x, y)


        @tf.function
        def fit_all():
            for x, y in ds:
                with tf.GradientTape() as tape:
                    loss = model(x)
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))


        with tf.GradientTape() as tape:
            loss = model(x)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        """
    result = run(source, ONLY)
    assert "broadcast_variables(" not in result.output.decode()
    assert broadcasts(result) == []
    assert notes(result) == [
        (15, "broadcast m.variables from rank 0 after the first step (sdp.broadcast_variables): "
             "the converter cannot name it here"),
        (20, "training loop inside a tf.function: after its first step, broadcast the model and "
             "optimizer variables from rank 0 (sdp.broadcast_variables)"),
        (29, "no training loop found around this step: after the first step, broadcast the model "
             "and optimizer variables from rank 0 (sdp.broadcast_variables)"),
    ]


def test_keras_fit_with_a_train_step_override_is_left_to_the_fit_callback():
    result = run(
        """\
        import tensorflow as tf
        from tensorflow import keras


        class MyModel(keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(y=y, y_pred=self(x, training=True))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply(gradients, self.trainable_variables)
                return {"loss": loss}


        model = MyModel()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.fit(dataset, epochs=2)
        """,
        ONLY,
    )
    assert "broadcast" not in result.output.decode()
    assert [c for c in result.changes if c.transform == ONLY] == []


def test_converting_the_output_again_changes_nothing():
    result = run(
        """\
        import tensorflow as tf

        opt = tf.keras.optimizers.SGD(0.1)
        for x, y in ds:
            with tf.GradientTape() as tape:
                loss = model(x)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        """,
        ONLY,
    )
    assert result.output.decode().count("sdp.broadcast_variables(") == 2
    check_noop(result.output.decode(), only=ONLY)


def test_a_script_that_broadcasts_itself_and_unrelated_loops_are_left_alone():
    check_noop(
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        opt = tf.keras.optimizers.SGD(0.1)
        for x, y in ds:
            with tf.GradientTape() as tape:
                loss = model(x)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            if step == 0:
                sdp.broadcast_variables(model.variables + opt.variables, root_rank=0)
        for x, y in test_ds:
            print(model(x))
        """,
        only=ONLY,
    )


def test_a_script_made_data_parallel_by_hand_is_left_alone():
    # fixtures/tensorflow/already_converted, looked at as if it were this converter's output.
    check_noop(ALREADY_CONVERTED.read_text(), only=ONLY)


FIT = """\
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
{before}model.fit(x, y, epochs=1)
{after}"""


def test_keras_weights_read_before_fit_get_rank_0s_first():
    result = run(FIT.format(before="initial = model.get_weights()\n", after=""), ONLY)
    out = result.output.decode()
    assert (
        'model.compile(optimizer="sgd", loss="mse")\n'
        "sdp.broadcast_variables(model.variables, root_rank=0)\n"
        "initial = model.get_weights()\n"
    ) in out
    assert reported(result, ONLY, manual=False) == [
        (5, "sdp.broadcast_variables(model.variables, root_rank=0) before this line: it reads "
            "model's weights before fit, whose callback gives every worker rank 0's weights only "
            "at its first batch")
    ]
    again = run(out, ONLY)
    assert again.output.decode() == out and reported(again, ONLY, manual=False) == []


def test_keras_weights_read_only_after_fit_get_no_broadcast():
    result = run(FIT.format(before="model.summary()\n", after="final = model.get_weights()\n"),
                 ONLY)
    assert "broadcast_variables" not in result.output.decode()
    assert reported(result, ONLY, manual=False) == []
