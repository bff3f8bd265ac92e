from __future__ import annotations

from .helpers import TF_ALREADY_CONVERTED, check_noop, check_transformed, messages, reported, run

ONLY = "wrap_gradient_tape"
ALREADY_CONVERTED = TF_ALREADY_CONVERTED


def wrapped(result):
    return reported(result, ONLY, manual=False)


def notes(result):
    return reported(result, ONLY, manual=True)


def test_the_tape_of_an_eager_loop_is_wrapped_after_its_with_block():
    result = check_transformed(
        """\
        import tensorflow as tf

        optimizer = tf.keras.optimizers.SGD(0.1)
        for x, y in dataset:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        optimizer = tf.keras.optimizers.SGD(0.1)
        for x, y in dataset:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tape = sdp.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        """,
        only=ONLY,
    )
    assert wrapped(result) == [
        (5, "tape = sdp.DistributedGradientTape(tape): gradients averaged across workers before "
            "optimizer.apply_gradients")
    ]


def test_every_import_spelling_and_keras_3_apply():
    check_transformed(
        """\
        from tensorflow import GradientTape
        from tensorflow.keras.optimizers import Adam
        import tensorflow as tf
        import keras

        adam = Adam()
        sgd = keras.optimizers.SGD(0.1)
        for x, y in dataset:
            with GradientTape() as t1:
                loss = model(x)
            adam.apply_gradients(zip(t1.gradient(loss, model.trainable_variables), model.trainable_variables))
            with tf.autodiff.GradientTape(persistent=True) as t2:
                loss = model(x)
            sgd.apply(t2.gradient(loss, model.trainable_variables), model.trainable_variables)
        """,
        """\
        from tensorflow import GradientTape
        from tensorflow.keras.optimizers import Adam
        import tensorflow as tf
        import keras
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        adam = Adam()
        sgd = keras.optimizers.SGD(0.1)
        for x, y in dataset:
            with GradientTape() as t1:
                loss = model(x)
            t1 = sdp.DistributedGradientTape(t1)
            adam.apply_gradients(zip(t1.gradient(loss, model.trainable_variables), model.trainable_variables))
            with tf.autodiff.GradientTape(persistent=True) as t2:
                loss = model(x)
            t2 = sdp.DistributedGradientTape(t2)
            sgd.apply(t2.gradient(loss, model.trainable_variables), model.trainable_variables)
        """,
        only=ONLY,
    )


def test_two_tapes_in_one_with_inside_a_tf_function_gan():
    result = check_transformed(
        """\
        import tensorflow as tf

        g_opt = tf.keras.optimizers.Adam(1e-4)
        d_opt = tf.keras.optimizers.Adam(1e-4)


        @tf.function
        def train_step(images):
            noise = tf.random.normal([BATCH, 100])
            with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
                fake = generator(noise, training=True)
                g_loss = gen_loss(discriminator(fake, training=True))
                d_loss = disc_loss(discriminator(images, training=True), discriminator(fake, training=True))
            g_grads = gen_tape.gradient(g_loss, generator.trainable_variables)
            d_grads = disc_tape.gradient(d_loss, discriminator.trainable_variables)
            g_opt.apply_gradients(zip(g_grads, generator.trainable_variables))
            d_opt.apply_gradients(zip(d_grads, discriminator.trainable_variables))
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        g_opt = tf.keras.optimizers.Adam(1e-4)
        d_opt = tf.keras.optimizers.Adam(1e-4)


        @tf.function
        def train_step(images):
            noise = tf.random.normal([BATCH, 100])
            with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
                fake = generator(noise, training=True)
                g_loss = gen_loss(discriminator(fake, training=True))
                d_loss = disc_loss(discriminator(images, training=True), discriminator(fake, training=True))
            gen_tape = sdp.DistributedGradientTape(gen_tape)
            disc_tape = sdp.DistributedGradientTape(disc_tape)
            g_grads = gen_tape.gradient(g_loss, generator.trainable_variables)
            d_grads = disc_tape.gradient(d_loss, discriminator.trainable_variables)
            g_opt.apply_gradients(zip(g_grads, generator.trainable_variables))
            d_opt.apply_gradients(zip(d_grads, discriminator.trainable_variables))
        """,
        only=ONLY,
    )
    assert wrapped(result) == [
        (10, "gen_tape = sdp.DistributedGradientTape(gen_tape) in train_step(): gradients averaged "
             "across workers before g_opt.apply_gradients"),
        (10, "disc_tape = sdp.DistributedGradientTape(disc_tape) in train_step(): gradients "
             "averaged across workers before d_opt.apply_gradients"),
    ]


def test_tapes_in_methods_and_a_keras_train_step_override():
    check_transformed(
        """\
        import tensorflow as tf
        from tensorflow import keras


        class Trainer:
            def step(self, x, y):
                with tf.GradientTape() as tape:
                    loss = self.loss(y, self.model(x))
                grads = tape.gradient(loss, self.model.trainable_variables)
                grads, _ = tf.clip_by_global_norm(grads, 1.0)
                self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))


        class MyModel(keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(y=y, y_pred=self(x, training=True))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply(gradients, self.trainable_variables)
                return {"loss": loss}

        if __name__ == "__main__":
            main()
        """,
        """\
        import tensorflow as tf
        from tensorflow import keras
        import sdp_runtime.tensorflow as sdp

        sdp.init()


        class Trainer:
            def step(self, x, y):
                with tf.GradientTape() as tape:
                    loss = self.loss(y, self.model(x))
                tape = sdp.DistributedGradientTape(tape)
                grads = tape.gradient(loss, self.model.trainable_variables)
                grads, _ = tf.clip_by_global_norm(grads, 1.0)
                self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))


        class MyModel(keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(y=y, y_pred=self(x, training=True))
                tape = sdp.DistributedGradientTape(tape)
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply(gradients, self.trainable_variables)
                return {"loss": loss}

        if __name__ == "__main__":
            main()
        """,
        only=ONLY,
    )


def test_gradients_taken_while_recording_and_returned_by_a_helper():
    check_transformed(
        """\
        import tensorflow as tf

        opt = tf.keras.optimizers.Adam()


        def compute_grads(model, x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
                grads = tape.gradient(loss, model.trainable_variables)
            return grads


        for x, y in ds:
            opt.apply_gradients(zip(compute_grads(model, x, y), model.trainable_variables))
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        opt = tf.keras.optimizers.Adam()


        def compute_grads(model, x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
                tape = sdp.DistributedGradientTape(tape)
                grads = tape.gradient(loss, model.trainable_variables)
            return grads


        for x, y in ds:
            opt.apply_gradients(zip(compute_grads(model, x, y), model.trainable_variables))
        """,
        only=ONLY,
    )


def test_tapes_whose_gradients_are_not_applied_keep_per_worker_gradients():
    # The inner tape of a gradient penalty, and a saliency map: only the outer tape is wrapped.
    result = check_transformed(
        """\
        import tensorflow as tf

        opt = tf.keras.optimizers.Adam()


        def critic_step(x, y):
            with tf.GradientTape() as outer:
                with tf.GradientTape() as inner:
                    inner.watch(x)
                    pred = critic(x)
                gp = tf.reduce_mean((tf.norm(inner.gradient(pred, x)) - 1.0) ** 2)
                loss = critic_loss(y, pred) + 10.0 * gp
            grads = outer.gradient(loss, critic.trainable_variables)
            opt.apply_gradients(zip(grads, critic.trainable_variables))


        def saliency(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = critic(x)
            return tape.gradient(out, x)
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        opt = tf.keras.optimizers.Adam()


        def critic_step(x, y):
            with tf.GradientTape() as outer:
                with tf.GradientTape() as inner:
                    inner.watch(x)
                    pred = critic(x)
                gp = tf.reduce_mean((tf.norm(inner.gradient(pred, x)) - 1.0) ** 2)
                loss = critic_loss(y, pred) + 10.0 * gp
            outer = sdp.DistributedGradientTape(outer)
            grads = outer.gradient(loss, critic.trainable_variables)
            opt.apply_gradients(zip(grads, critic.trainable_variables))


        def saliency(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = critic(x)
            return tape.gradient(out, x)
        """,
        only=ONLY,
    )
    assert [line for line, _ in wrapped(result)] == [7]


def test_one_name_for_several_tapes_each_judged_by_its_own_gradients():
    # ``tape`` and ``grads`` reused for the discriminator, the generator and a saliency map: the
    # saliency tape keeps its per-worker gradients, each report names its own optimizer.
    result = check_transformed(
        """\
        import tensorflow as tf

        for x, y in ds:
            with tf.GradientTape() as tape:
                d_loss = d_loss_fn(x)
            grads = tape.gradient(d_loss, D.trainable_variables)
            d_opt.apply_gradients(zip(grads, D.trainable_variables))
            with tf.GradientTape() as tape:
                g_loss = g_loss_fn(x)
            grads = tape.gradient(g_loss, G.trainable_variables)
            g_opt.apply_gradients(zip(grads, G.trainable_variables))
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = D(x)
            grads = tape.gradient(out, x)
            log_saliency(grads)
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        for x, y in ds:
            with tf.GradientTape() as tape:
                d_loss = d_loss_fn(x)
            tape = sdp.DistributedGradientTape(tape)
            grads = tape.gradient(d_loss, D.trainable_variables)
            d_opt.apply_gradients(zip(grads, D.trainable_variables))
            with tf.GradientTape() as tape:
                g_loss = g_loss_fn(x)
            tape = sdp.DistributedGradientTape(tape)
            grads = tape.gradient(g_loss, G.trainable_variables)
            g_opt.apply_gradients(zip(grads, G.trainable_variables))
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = D(x)
            grads = tape.gradient(out, x)
            log_saliency(grads)
        """,
        only=ONLY,
    )
    assert wrapped(result) == [
        (4, "tape = sdp.DistributedGradientTape(tape): gradients averaged across workers before "
            "d_opt.apply_gradients"),
        (8, "tape = sdp.DistributedGradientTape(tape): gradients averaged across workers before "
            "g_opt.apply_gradients"),
    ]


def test_a_tape_not_opened_by_a_with_statement_needs_a_person():
    source = """\
        import tensorflow as tf

        opt = tf.keras.optimizers.SGD(0.1)
        tape = tf.GradientTape()
        with tape:
            loss = model(x)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        """
    result = run(source, ONLY)
    assert "DistributedGradientTape(" not in result.output.decode()
    assert notes(result) == [
        (4, "tape 'tape' is not opened by a with statement: wrap it in sdp.DistributedGradientTape "
            "before calling gradient()")
    ]


def test_training_the_converter_cannot_average_needs_a_person():
    # Variables updated by hand, optimizer.minimize and TF1 graph code: reported, nothing changed.
    by_hand = """\
        import tensorflow as tf

        w = tf.Variable(1.0)
        for x, y in ds:
            with tf.GradientTape() as tape:
                loss = (w * x - y) ** 2
            grad = tape.gradient(loss, w)
            w.assign_sub(0.1 * grad)
        """
    result = check_noop(by_hand, only=ONLY)
    assert notes(result) == [
        (8, "variables updated by hand with the gradients of 'tape': average them "
            "(sdp.DistributedGradientTape) and broadcast the initial variables from rank 0 by "
            "hand, or use a Keras optimizer")
    ]
    minimize = """\
        import tensorflow as tf

        opt = tf.keras.optimizers.SGD(0.1)
        for x, y in ds:
            opt.minimize(lambda: loss_fn(model(x), y), model.trainable_variables)
        """
    result = check_noop(minimize, only=ONLY)
    assert notes(result) == [
        (5, "optimizer.minimize computes gradients inside the optimizer: compute them with a "
            "GradientTape and apply_gradients so that they can be averaged")
    ]
    tf1 = """\
        import tensorflow as tf

        x = tf.compat.v1.placeholder(tf.float32)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(train_op)
        """
    result = check_noop(tf1, only=ONLY)
    assert notes(result) == [
        (3, "TF1 graph-mode code (tf.compat.v1.train.GradientDescentOptimizer, "
            "tf.compat.v1.Session, tf.compat.v1.placeholder): not converted; port the training "
            "step to TF2 (GradientTape or Keras fit) first, or average its gradients by hand")
    ]


def test_converting_the_output_again_changes_nothing():
    result = run(
        """\
        import tensorflow as tf

        opt = tf.keras.optimizers.SGD(0.1)


        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
                grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))


        for x, y in ds:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        """,
        ONLY,
    )
    assert result.output.decode().count("sdp.DistributedGradientTape(tape)") == 2
    check_noop(result.output.decode(), only=ONLY)


def test_a_tape_wrapped_already_and_unrelated_code_are_left_alone():
    check_noop(
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        opt = tf.keras.optimizers.SGD(0.1 * sdp.size())
        for x, y in ds:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
            tape = sdp.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        with open("log.txt") as f:
            print(f.read())
        with tf.GradientTape() as probe:
            out = model(x)
        print(probe.gradient(out, model.trainable_variables))
        """,
        only=ONLY,
    )


def test_a_script_made_data_parallel_by_hand_is_left_alone():
    # fixtures/tensorflow/already_converted, looked at as if it were this converter's output.
    check_noop(ALREADY_CONVERTED.read_text(), only=ONLY)


def test_tf1_logging_alone_is_not_graph_mode():
    # tf.compat.v1.logging / flags are used by TF2 scripts too; only sessions, placeholders and
    # tf.compat.v1.train optimizers are TF1 training.
    source = """\
        import tensorflow as tf

        tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
        opt = tf.keras.optimizers.SGD(0.1)
        for x in tf.data.Dataset.from_tensor_slices(data).batch(8):
            with tf.GradientTape() as tape:
                loss = model(x)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        """
    result = run(source, ONLY)
    assert not [c for c in result.changes if "TF1" in c.message]
    assert "sdp.DistributedGradientTape(tape)" in result.output.decode()
    graph = source.replace("tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)",
                           "sess = tf.compat.v1.Session()")
    assert any("TF1 graph-mode code (tf.compat.v1.Session)" in m
               for m in messages(run(graph, ONLY), ONLY, manual=True))


def test_a_session_that_only_holds_a_gpu_config_for_keras_is_not_graph_mode():
    # keras-yolo3: ConfigProto with allow_growth, a Session(config=...) handed to Keras's
    # set_session, then Keras fit: nothing runs the session.
    source = """\
        import tensorflow as tf

        config = tf.compat.v1.ConfigProto()
        config.gpu_options.allow_growth = True
        session = tf.compat.v1.Session(config=config)
        tf.compat.v1.keras.backend.set_session(session)
        tf.compat.v1.keras.backend.set_session(tf.compat.v1.Session(config=config))
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
        model.fit(x, y, epochs=1)
        """
    assert not [m for m in messages(run(source, ONLY), ONLY, manual=True) if "TF1" in m]
    # A session that runs something is graph-mode code.
    ran = source + "session.run(tf.compat.v1.global_variables_initializer())\n"
    assert any("TF1 graph-mode code (tf.compat.v1.Session" in m
               for m in messages(run(ran, ONLY), ONLY, manual=True))
