"""The program model: what the transforms ask about a file, answered once and tested here.

- ``syntax``: reading and building code (``code``, argument lookup and editing, ``x * sdp.size()``,
  where the import block ends).
- ``keras``: Keras names as data and the questions about them (optimizer classes, ``compile``,
  ``fit``).
- ``index``: one walk of the file: where every name is bound and read, scopes, attribute bindings.
- ``scopes``: libcst scope analysis for the questions that need it (uses of a binding, callers and
  callees, which parameter an argument binds, the training calls and loops).
- ``training``: where training happens (TF tapes, their steps, the loops that drive them).
- ``datasets``: where a ``tf.data`` pipeline comes from and which one feeds training.

Every function here takes the file's program model, ``model.FileModel`` (built once per file by
the engine, or on its own with ``FileModel.from_source``), never a transform: nothing in this
package imports ``base``, a transform, the engine or anything above them
(tests/program/test_layering.py). Transforms import from here (and from ``base``), never from
each other, and pass ``self.fm``.
"""
